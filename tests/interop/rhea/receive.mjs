// receive.mjs ADDRESS COUNT [SELECTOR]: receives COUNT messages from ADDRESS (only those the JMS
// SELECTOR picks, when given: the source filter apache.org:selector-filter:string), accepts each
// and prints its body, one a line; then detaches and exits 0.
import { connect, rhea } from "./connect.mjs";

const [address, count, selector] = [process.argv[2], Number(process.argv[3]), process.argv[4]];
const connection = connect();
const source = { address };
if (selector) source.filter = rhea.filter.selector(selector);
const receiver = connection.open_receiver({ source, credit_window: 0, autoaccept: true });
let received = 0;

receiver.on("receiver_open", () => receiver.add_credit(count));
receiver.on("message", (context) => {
  console.log(context.message.body);
  received += 1;
  if (received === count) {
    receiver.close();
    connection.close();
  }
});
