// Adds N `charge` and N `charge_safe` jobs (interleaved; with HANDLERS `races`,
// `check_then_act` and `claim_first`) with BullMQ's Queue.add, through TWICE_BROKER, one every
// PACE_MS milliseconds (default 0), and prints "<job id> <name>" per job as it goes.
// Usage: node enqueue.js N [HANDLERS [PACE_MS]]
"use strict";

const { Queue, QUEUE, connection } = require("./app");

async function main() {
  const n = Number(process.argv[2]);
  const names = process.argv[3] === "races" ? ["check_then_act", "claim_first"]
                                            : ["charge", "charge_safe"];
  const pace = Number(process.argv[4] || 0);
  const queue = new Queue(QUEUE, { connection: connection() });
  for (let i = 0; i < n; i++) {
    for (const name of names) {
      const job = await queue.add(name, { order_id: `order-${i}` },
                                  { removeOnComplete: false, removeOnFail: false });
      process.stdout.write(`${job.id} ${name}\n`);
      if (pace > 0) await new Promise((resolve) => setTimeout(resolve, pace));
    }
  }
  await queue.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
