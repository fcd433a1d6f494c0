// client.mjs ADDRESS REQUEST...: request-response: a receiver with a dynamic source (the space
// makes it a reply address of its own), then each REQUEST sent to ADDRESS with that reply-to and
// a correlation-id, one at a time; prints "REQUEST => REPLY" per answer and exits 0 after the last.
import { connect } from "./connect.mjs";

const [address, ...requests] = process.argv.slice(2);
const connection = connect();
const sender = connection.open_sender(address);
const replies = connection.open_receiver({ source: { dynamic: true } });
let replyTo;
let next = 0;
let asked = -1; // the last request sent

// A request goes once the reply address is known and the sender has credit.
function ask() {
  if (replyTo === undefined || asked === next || !sender.sendable()) return;
  asked = next;
  sender.send({ body: requests[next], reply_to: replyTo, correlation_id: `request-${next}` });
}
replies.on("receiver_open", (context) => {
  replyTo = context.receiver.remote.attach.source.address;
  ask();
});
sender.on("sendable", ask);
replies.on("message", (context) => {
  const reply = context.message;
  if (reply.correlation_id !== `request-${next}`) {
    console.error(`reply to ${reply.correlation_id}, awaiting request-${next}`);
    process.exit(1);
  }
  console.log(`${requests[next]} => ${reply.body}`);
  next += 1;
  if (next === requests.length) connection.close();
  else ask();
});
