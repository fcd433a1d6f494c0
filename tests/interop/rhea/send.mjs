// send.mjs ADDRESS COUNT: sends COUNT messages to ADDRESS, body "message N" (N from 1) with the
// application property colour "green" (odd N) or "red" (even N), and waits for every outcome.
// Prints "accepted A of COUNT" and exits 0 when all were accepted, 1 otherwise.
import { connect } from "./connect.mjs";

const [address, count] = [process.argv[2], Number(process.argv[3])];
const connection = connect();
const sender = connection.open_sender(address);
let sent = 0;
let accepted = 0;
let settled = 0;

sender.on("sendable", () => {
  while (sender.sendable() && sent < count) {
    sent += 1;
    const colour = sent % 2 ? "green" : "red";
    sender.send({ body: `message ${sent}`, application_properties: { colour } });
  }
});
function settle(ok) {
  settled += 1;
  if (ok) accepted += 1;
  if (settled === count) {
    console.log(`accepted ${accepted} of ${count}`);
    connection.close();
    process.exitCode = accepted === count ? 0 : 1;
  }
}
sender.on("accepted", () => settle(true));
sender.on("rejected", (context) => {
  console.log(`rejected: ${context.delivery.remote_state.error?.description}`);
  settle(false);
});
sender.on("released", () => settle(false));
sender.on("modified", () => settle(false));
