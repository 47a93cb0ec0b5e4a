// The BullMQ example app's shared part: the queue's Redis connection and the two processors.
//
//   charge       NOT idempotent: every execution appends the job id to TWICE_EFFECTS
//   charge_safe  idempotent: takes `SET twice:done:<id> 1 NX` on the real Redis
//                (TWICE_EFFECT_REDIS, never through the proxy) before the effect
//
// Both append "<id> <name>" to TWICE_RUNS after the work.  Each line is one write(2) on a file
// opened with O_APPEND (fs.appendFileSync), so concurrent workers never interleave.
//
// With TWICE_WORK_MS, each execution first works that long (a timer: the event loop stays free,
// so the worker keeps renewing its lock), and appends "<id> <name> <start ms> <end ms> <worker>"
// to TWICE_SPANS: two spans of one id that overlap are two runs at once.
"use strict";

const fs = require("fs");
const path = require("path");

// The packages of tests/node (installed there by scripts/deps.sh from its lockfile).  TWICE_BULLMQ
// names the BullMQ package: `bullmq` (5.x, the default) or `bullmq6` (6.x, an npm alias; ioredis
// is its peer dependency, the same ioredis 5 of tests/node).
const NODE_MODULES = path.join(__dirname, "..", "..", "node", "node_modules");
const BULLMQ = process.env.TWICE_BULLMQ || "bullmq";
if (!/^bullmq[0-9]*$/.test(BULLMQ)) throw new Error(`TWICE_BULLMQ: not BullMQ: ${BULLMQ}`);
const bullmq = require(path.join(NODE_MODULES, BULLMQ));
const BULLMQ_VERSION = require(path.join(NODE_MODULES, BULLMQ, "package.json")).version;
const { Queue, Worker } = bullmq;
const IORedis = require(path.join(NODE_MODULES, "ioredis"));

const QUEUE = process.env.TWICE_QUEUE || "twice";

function hostPort(addr) {
  const i = addr.lastIndexOf(":");
  return { host: addr.slice(0, i), port: Number(addr.slice(i + 1)) };
}

// The broker connection (twice's listener): BullMQ wants maxRetriesPerRequest null on the
// connections its workers block on.
function connection() {
  return { ...hostPort(process.env.TWICE_BROKER), maxRetriesPerRequest: null };
}

function append(file, line) {
  fs.appendFileSync(file, line + "\n");
}

let effectRedis = null;
function effects() {
  if (effectRedis === null) effectRedis = new IORedis(hostPort(process.env.TWICE_EFFECT_REDIS));
  return effectRedis;
}

const WORK_MS = Number(process.env.TWICE_WORK_MS || 0);

// The processor's work, then its effect, then its lines.
function run(job, worker, effect) {
  return async () => {
    const start = Date.now();
    if (WORK_MS > 0) await new Promise((resolve) => setTimeout(resolve, WORK_MS));
    await effect();
    append(process.env.TWICE_RUNS, `${job.id} ${job.name}`);
    if (WORK_MS > 0 && process.env.TWICE_SPANS)
      append(process.env.TWICE_SPANS, `${job.id} ${job.name} ${start} ${Date.now()} ${worker}`);
  };
}

// The race handlers: both work WORK_MS before their effect.  check_then_act checks a done-marker
// first and sets it after the work (a copy that runs beside the first passes the check too);
// claim_first takes `SET twice:claim:<id> NX` before the work (only the claimant works).
async function checkThenAct(job, worker) {
  const start = Date.now();
  if ((await effects().exists(`twice:mark:${job.id}`)) === 0) {
    if (WORK_MS > 0) await new Promise((resolve) => setTimeout(resolve, WORK_MS));
    append(process.env.TWICE_EFFECTS, job.id);
    await effects().set(`twice:mark:${job.id}`, "1");
  }
  finished(job, worker, start);
}

async function claimFirst(job, worker) {
  const start = Date.now();
  if ((await effects().set(`twice:claim:${job.id}`, "1", "NX")) === "OK") {
    if (WORK_MS > 0) await new Promise((resolve) => setTimeout(resolve, WORK_MS));
    append(process.env.TWICE_EFFECTS, job.id);
  }
  finished(job, worker, start);
}

// A run's lines: the runs file, and its span.
function finished(job, worker, start) {
  append(process.env.TWICE_RUNS, `${job.id} ${job.name}`);
  if (WORK_MS > 0 && process.env.TWICE_SPANS)
    append(process.env.TWICE_SPANS, `${job.id} ${job.name} ${start} ${Date.now()} ${worker}`);
}

const PROCESSORS = {
  check_then_act: checkThenAct,
  claim_first: claimFirst,
  charge(job, worker) {
    return run(job, worker, async () => append(process.env.TWICE_EFFECTS, job.id))();
  },
  charge_safe(job, worker) {
    return run(job, worker, async () => {
      const first = (await effects().set(`twice:done:${job.id}`, "1", "NX")) === "OK";
      if (first) append(process.env.TWICE_EFFECTS, job.id);
    })();
  },
};

async function closeEffects() {
  if (effectRedis !== null) await effectRedis.quit().catch(() => {});
}

module.exports = { bullmq, BULLMQ_VERSION, Queue, Worker, IORedis, QUEUE, connection, closeEffects, PROCESSORS };
