// How every script here reaches a space: rhea's connect options from the environment, set by
// tests/test_interop_rhea.py: AMQP_HOST, AMQP_PORT, AMQP_USER, AMQP_PASSWORD (SASL PLAIN: rhea's
// own mechanisms are ANONYMOUS, PLAIN, EXTERNAL and XOAUTH2, no SCRAM, and the spaces take PLAIN
// over TLS only), AMQP_CA (the PEM file to trust: TLS on) and AMQP_SERVERNAME (the name the
// endpoint's certificate must carry). Also the bound on a run: a script that has not finished
// after AMQP_TIMEOUT seconds (default 30) prints why and exits 2, so nothing hangs.
import { readFileSync } from "node:fs";
import rhea from "rhea";

export function connect(container = rhea.create_container()) {
  const env = process.env;
  const options = {
    host: env.AMQP_HOST || "127.0.0.1",
    port: Number(env.AMQP_PORT),
    username: env.AMQP_USER,
    password: env.AMQP_PASSWORD,
    reconnect: false,
  };
  if (env.AMQP_CA) {
    Object.assign(options, {
      transport: "tls",
      ca: [readFileSync(env.AMQP_CA)],
      servername: env.AMQP_SERVERNAME || "localhost",
      rejectUnauthorized: true,
    });
  }
  const connection = container.connect(options);
  // A refused login, attach or connection ends the run with the peer's condition.
  for (const event of ["connection_error", "sender_error", "receiver_error", "disconnected"]) {
    connection.on(event, (context) => {
      const error = context.error || context.connection.error;
      if (event === "disconnected" && (context.connection.is_closed() || !error)) return;
      fail(`${event}: ${error ? `${error.condition}: ${error.description}` : "lost"}`);
    });
  }
  return connection;
}

export function fail(why) {
  console.error(why);
  process.exit(1);
}

const timeout = Number(process.env.AMQP_TIMEOUT || 30) * 1000;
setTimeout(() => {
  console.error(`timed out after ${timeout / 1000}s`);
  process.exit(2);
}, timeout).unref();

export { rhea };
