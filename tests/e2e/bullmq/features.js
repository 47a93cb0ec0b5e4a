// BullMQ's features beyond plain jobs, run against TWICE_BROKER (Redis itself, or twice in front
// of it): `node features.js`.  Prints one JSON line of what a user observes, the same however
// fast the machine is, so that a run through twice can be compared with a direct one:
//
//   delayed   a job added with `delay`: it ran, not before its delay
//   repeat    a job scheduler (`every`, `limit 3`): how many times its job ran
//   flow      a parent with two children (FlowProducer): the children ran first, and the parent
//             saw their return values
//   limited   a rate-limited worker (2 jobs per 300 ms): every job of 6 completed
//   progress  job.updateProgress(50) then (100): what QueueEvents said, and the job's last
//   retried   a job that fails once, attempts 2 with a fixed 100 ms back-off: its attempts and
//             its final state
//   bulk      Queue.addBulk of 3 jobs (one pipeline, no MULTI): how many ran
//   bullmq    the version of the BullMQ package that ran (TWICE_BULLMQ, app.js)
//
// Each feature has a queue of its own (feat-<name>), emptied first.
"use strict";

const { bullmq, BULLMQ_VERSION, Queue, Worker, IORedis, connection } = require("./app");
const { QueueEvents, FlowProducer } = bullmq;

const closers = [];
function track(x) {
  closers.push(x);
  return x;
}

function until(pred, what, ms = 20000) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const tick = async () => {
      try {
        if (await pred()) return resolve();
      } catch (e) {
        return reject(e);
      }
      if (Date.now() - t0 > ms) return reject(new Error(`timed out waiting for ${what}`));
      setTimeout(tick, 20);
    };
    tick();
  });
}

async function fresh(name) {
  const q = track(new Queue(`feat-${name}`, { connection: connection() }));
  await q.obliterate({ force: true });
  return q;
}

async function delayed() {
  const q = await fresh("delayed");
  let ranAt = 0;
  track(new Worker(q.name, async () => { ranAt = Date.now(); }, { connection: connection() }));
  const t0 = Date.now();
  await q.add("later", {}, { delay: 300 });
  await until(() => ranAt > 0, "the delayed job");
  return { ran: true, not_early: ranAt - t0 >= 300 };
}

async function repeat() {
  const q = await fresh("repeat");
  let runs = 0;
  track(new Worker(q.name, async () => { runs++; }, { connection: connection() }));
  await q.upsertJobScheduler("ticker", { every: 150, limit: 3 }, { name: "tick", data: {} });
  await until(() => runs >= 3, "three runs of the scheduled job");
  // no fourth run: the limit holds (the next one would be due 150 ms after the third)
  await new Promise((r) => setTimeout(r, 600));
  return runs;
}

async function flow() {
  const parent = await fresh("flow-parent");
  const child = await fresh("flow-child");
  const order = [];
  let seen = null;
  track(new Worker(child.name, async (job) => {
    order.push(job.name);
    return job.data.v;
  }, { connection: connection() }));
  track(new Worker(parent.name, async (job) => {
    order.push(job.name);
    seen = Object.values(await job.getChildrenValues()).sort();
  }, { connection: connection() }));
  const fp = track(new FlowProducer({ connection: connection() }));
  await fp.add({
    name: "parent", queueName: parent.name,
    children: [
      { name: "child", queueName: child.name, data: { v: 1 } },
      { name: "child", queueName: child.name, data: { v: 2 } },
    ],
  });
  await until(() => seen !== null, "the parent job");
  return { children_first: order.join(",") === "child,child,parent", values: seen };
}

async function limited() {
  const q = await fresh("limited");
  let done = 0;
  const w = track(new Worker(q.name, async () => {}, {
    connection: connection(), limiter: { max: 2, duration: 300 },
  }));
  w.on("completed", () => { done++; });
  for (let i = 0; i < 6; i++) await q.add("job", { i });
  await until(() => done >= 6, "six rate-limited jobs");
  return done;
}

async function progress() {
  const q = await fresh("progress");
  const events = track(new QueueEvents(q.name, { connection: connection() }));
  await events.waitUntilReady();
  const said = [];
  events.on("progress", ({ data }) => said.push(data));
  track(new Worker(q.name, async (job) => {
    await job.updateProgress(50);
    await job.updateProgress(100);
  }, { connection: connection() }));
  const job = await q.add("job", {});
  await until(async () => (await q.getJob(job.id)).finishedOn, "the job with progress");
  await until(() => said.length >= 2, "two progress events");
  return { events: said, last: (await q.getJob(job.id)).progress };
}

async function retried() {
  const q = await fresh("retried");
  let calls = 0;
  track(new Worker(q.name, async () => {
    calls++;
    if (calls === 1) throw new Error("first attempt fails");
  }, { connection: connection() }));
  const job = await q.add("flaky", {}, { attempts: 2, backoff: { type: "fixed", delay: 100 } });
  await until(async () => (await q.getJob(job.id)).finishedOn, "the retried job");
  const j = await q.getJob(job.id);
  return { id: job.id, calls, attempts_made: j.attemptsMade, state: await j.getState() };
}

async function bulk() {
  const q = await fresh("bulk");
  let runs = 0;
  track(new Worker(q.name, async () => { runs++; }, { connection: connection() }));
  await q.addBulk([1, 2, 3].map((i) => ({ name: "bulk", data: { i } })));
  await until(() => runs >= 3, "three bulk jobs");
  return runs;
}

async function main() {
  const out = {};
  for (const [name, fn] of Object.entries({ delayed, repeat, flow, limited, progress, retried,
                                             bulk })) {
    out[name] = await fn();
  }
  for (const c of closers.reverse()) await c.close().catch(() => {});
  out.bullmq = BULLMQ_VERSION;
  process.stdout.write(JSON.stringify(out) + "\n");
  process.exit(0);
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
