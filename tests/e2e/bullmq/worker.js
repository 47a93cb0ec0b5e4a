// One BullMQ worker of the example app: `node worker.js NAME CONCURRENCY`, processors by job
// name (app.js).  SIGTERM/SIGINT: close (finishing the jobs in hand) and exit 0.
// TWICE_LOCK_MS, TWICE_STALLED_MS and TWICE_MAX_STALLED set the Worker's lockDuration,
// stalledInterval and maxStalledCount (BullMQ's defaults: 30000, 30000, 1).
"use strict";

const { Worker, QUEUE, connection, closeEffects, PROCESSORS } = require("./app");

const name = process.argv[2] || "worker";
const concurrency = Number(process.argv[3] || 1);
const log = (...a) => console.log(`[${name} ${new Date().toISOString()}]`, ...a);

const worker = new Worker(
  QUEUE,
  async (job) => {
    const p = PROCESSORS[job.name];
    if (p === undefined) throw new Error(`no processor for ${job.name}`);
    await p(job, name);
  },
  {
    connection: connection(),
    concurrency,
    autorun: true,
    ...(process.env.TWICE_LOCK_MS ? { lockDuration: Number(process.env.TWICE_LOCK_MS) } : {}),
    ...(process.env.TWICE_STALLED_MS
      ? { stalledInterval: Number(process.env.TWICE_STALLED_MS) }
      : {}),
    ...(process.env.TWICE_MAX_STALLED
      ? { maxStalledCount: Number(process.env.TWICE_MAX_STALLED) }
      : {}),
  },
);
worker.on("completed", (job) => log("completed", job.id, job.name));
worker.on("failed", (job, err) => log("failed", job && job.id, err && err.message));
worker.on("stalled", (id) => log("stalled", id));
worker.on("active", (job) => log("active", job.id, job.name));
worker.on("error", (err) => log("error", err && err.message));

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  log("stopping");
  try {
    await worker.close();
  } catch (e) {
    log("close failed:", e && e.message);
  } finally {
    await closeEffects();
    process.exit(0);
  }
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
log(`consuming ${QUEUE} with concurrency ${concurrency}`);
