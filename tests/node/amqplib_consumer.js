// amqplib_consumer.js HOST PORT QUEUE RUNS EFFECTS
//
// A Node.js worker with amqplib (from the npm registry, installed into this folder by
// scripts/deps.sh), for tests/integration/test_amqp_identity.py: consumes QUEUE with manual
// acks until RUNS deliveries were handled, naming each message's handler by its `type` header
// (a header, where Bunny's worker reads the property).  `charge` appends the message id to
// EFFECTS on every run (not idempotent); `charge_safe` appends it only the first time it sees
// the id (idempotent).  Exits 0 once RUNS deliveries were handled, 1 if that took over 60 s or
// the connection failed.
"use strict";

const fs = require("fs");
const amqp = require("amqplib");

const [host, port, queue, runsText, effects] = process.argv.slice(2);
const runs = Number(runsText);

async function main() {
  const conn = await amqp.connect({ hostname: host, port: Number(port), heartbeat: 0 });
  const ch = await conn.createChannel();
  await ch.prefetch(1);
  await ch.checkQueue(queue);
  const seen = new Set();
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  await ch.consume(queue, (msg) => {
    const id = msg.properties.messageId;
    const type = (msg.properties.headers || {}).type;
    const effect = type === "charge" || (type === "charge_safe" && !seen.has(id));
    seen.add(id);
    if (effect) fs.appendFileSync(effects, id + "\n");
    ch.ack(msg);
    if (++done >= runs) finish(true);
  });
  const timer = setTimeout(() => finish(false), 60000);
  const ok = await finished;
  clearTimeout(timer);
  await conn.close();
  return ok;
}

main().then(
  (ok) => process.exit(ok ? 0 : 1),
  (err) => {
    console.error(err && err.stack ? err.stack : err);
    process.exit(1);
  }
);
