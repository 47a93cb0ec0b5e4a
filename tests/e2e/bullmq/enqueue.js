// Adds N `charge` and N `charge_safe` jobs (interleaved) with BullMQ's Queue.add, through
// TWICE_BROKER, and prints "<job id> <name>" per job.  Usage: node enqueue.js N
"use strict";

const { Queue, QUEUE, connection } = require("./app");

async function main() {
  const n = Number(process.argv[2]);
  const queue = new Queue(QUEUE, { connection: connection() });
  for (let i = 0; i < n; i++) {
    for (const name of ["charge", "charge_safe"]) {
      const job = await queue.add(name, { order_id: `order-${i}` },
                                  { removeOnComplete: false, removeOnFail: false });
      process.stdout.write(`${job.id} ${name}\n`);
    }
  }
  await queue.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
