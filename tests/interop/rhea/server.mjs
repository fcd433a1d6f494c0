// server.mjs ADDRESS COUNT: answers COUNT requests from ADDRESS, each with its body in upper case
// and its correlation-id, to its reply-to, on ONE sender with no target address (the anonymous
// relay: each reply's `to` says where it goes). Prints "ready" once its receiver is attached,
// then "answered N" after each reply is accepted; exits 0 after COUNT.
import { connect } from "./connect.mjs";

const [address, count] = [process.argv[2], Number(process.argv[3])];
const connection = connect();
const relay = connection.open_sender({ target: {} }); // no address: the anonymous relay
const requests = connection.open_receiver({ source: { address }, autoaccept: false });
let answered = 0;

requests.on("receiver_open", () => console.log("ready"));
requests.on("message", (context) => {
  const request = context.message;
  relay.send({
    to: request.reply_to,
    correlation_id: request.correlation_id,
    body: String(request.body).toUpperCase(),
  });
  context.delivery.accept();
});
relay.on("accepted", () => {
  answered += 1;
  console.log(`answered ${answered}`);
  if (answered === count) connection.close();
});
relay.on("rejected", (context) => {
  const error = context.delivery.remote_state.error;
  console.log(`reply rejected: ${error?.condition}: ${error?.description}`);
  process.exitCode = 1;
  connection.close();
});
