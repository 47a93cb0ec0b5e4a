// toxiproxy_client.js - drives twice's Toxiproxy API with the npm toxiproxy-node-client, as a
// test suite that used Toxiproxy would, and measures what a client of the proxied broker sees.
//
//   node toxiproxy_client.js API_URL REDIS_PORT RABBIT_PORT SCENARIO
//
// Prints one JSON object (the measurements of SCENARIO) on stdout; tests/integration/
// test_toxiproxy_client.py asserts on them.  Redis is spoken raw (RESP over net), so bytes and
// timings are the socket's own; RabbitMQ through amqplib and raw AMQP bytes.
"use strict";

const net = require("net");
const { Toxiproxy } = require("toxiproxy-node-client");

const [API, REDIS_PORT, RABBIT_PORT, SCENARIO] = process.argv.slice(2);
const toxiproxy = new Toxiproxy(API);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => Number(process.hrtime.bigint() / 1000000n);

// A client socket that keeps what it received and how it ended.
function connect(port) {
    return new Promise((resolve) => {
        const s = net.connect({ host: "127.0.0.1", port: Number(port) });
        const c = { s, data: Buffer.alloc(0), chunks: 0, ended: false, error: null, endAt: 0 };
        s.on("data", (d) => { c.data = Buffer.concat([c.data, d]); c.chunks++; });
        s.on("end", () => { c.ended = true; c.endAt = now(); });
        s.on("close", () => { c.ended = true; if (!c.endAt) c.endAt = now(); });
        s.on("error", (e) => { c.error = e.code || String(e); c.ended = true; c.endAt = now(); });
        s.on("connect", () => resolve(c));
        s.once("error", () => resolve(c));
    });
}

// Waits until pred(c) or timeout ms; returns whether pred held.
async function until(c, pred, timeout) {
    const end = now() + timeout;
    while (!pred(c)) {
        if (now() >= end) return false;
        await sleep(2);
    }
    return true;
}

// Sends cmd and waits for `want` more bytes (or the end); returns [ms, bytes].
async function exchange(c, cmd, want, timeout = 10000) {
    const start = c.data.length, t0 = now();
    c.s.write(cmd);
    await until(c, (x) => x.data.length >= start + want || x.ended, timeout);
    return [now() - t0, c.data.subarray(start)];
}

const PING = "PING\r\n";
const PONG = "+PONG\r\n";
const ping = async (c) => (await exchange(c, PING, PONG.length))[0];
const close = (c) => c.s.destroy();

async function newProxy(name, upstreamPort) {
    try { await (await toxiproxy.get(name)).remove(); } catch (e) { /* none yet */ }
    return toxiproxy.createProxy({ name, listen: "localhost:0", upstream: `127.0.0.1:${upstreamPort}` });
}
const portOf = (proxy) => Number(proxy.listen.split(":").pop());

// RESP bulk of `n` bytes of a known pattern, stored under `key` (straight to Redis).
async function storeBig(key, n) {
    const value = Buffer.alloc(n);
    for (let i = 0; i < n; i++) value[i] = 97 + (i * 7 + (i >> 8)) % 26;
    const c = await connect(REDIS_PORT);
    const cmd = `*3\r\n$3\r\nSET\r\n$${key.length}\r\n${key}\r\n$${n}\r\n`;
    await exchange(c, Buffer.concat([Buffer.from(cmd), value, Buffer.from("\r\n")]), 5);
    close(c);
    return Buffer.concat([Buffer.from(`$${n}\r\n`), value, Buffer.from("\r\n")]);
}
const getCmd = (key) => `*2\r\n$3\r\nGET\r\n$${key.length}\r\n${key}\r\n`;

const scenarios = {
    // The client's own calls and what twice answers them.
    async api() {
        const out = {};
        out.version = await toxiproxy.getVersion();
        const p = await newProxy("redis_api", REDIS_PORT);
        out.created = p.toJson();
        out.all = Object.keys(await toxiproxy.getAll());
        out.got = (await toxiproxy.get("redis_api")).toJson();
        const t = await p.addToxic({ type: "latency", attributes: { latency: 10 } });
        out.toxic = t.toJson();
        out.toxic_got = (await p.getToxic("latency_downstream")).toJson();
        out.toxic_updated = (await t.update({ attributes: { jitter: 3 }, toxicity: 0.5 })).toJson();
        try {
            await toxiproxy.createProxy({ name: "redis_api", listen: "localhost:0", upstream: "x:1" });
            out.duplicate = "created";
        } catch (e) { out.duplicate = e.message; }
        try {
            await p.addToxic({ type: "latency", attributes: {} });
            out.toxic_duplicate = "created";
        } catch (e) { out.toxic_duplicate = e.message; }
        try {
            await p.addToxic({ type: "nosuch" });
            out.bad_type = "created";
        } catch (e) { out.bad_type = e.message; }
        await t.remove();
        out.toxics_after_remove = (await toxiproxy.get("redis_api")).toJson();
        out.populated = Object.keys(await toxiproxy.populate([
            { name: "redis_api", listen: p.listen, upstream: p.upstream },
            { name: "redis_pop", listen: "localhost:0", upstream: `127.0.0.1:${REDIS_PORT}` },
        ]));
        const c = await connect(portOf(await toxiproxy.get("redis_pop")));
        out.pop_ping = (await exchange(c, PING, PONG.length))[1].toString();
        close(c);
        await (await toxiproxy.get("redis_pop")).remove();
        await p.remove();
        try { await toxiproxy.get("redis_api"); out.after_remove = "found"; } catch (e) { out.after_remove = e.message; }
        const d = await connect(portOf(p));
        out.connect_after_remove = d.error;
        return out;
    },

    // latency (and jitter) on a connection opened before the toxic, and taken off it again.
    async latency() {
        const p = await newProxy("redis_lat", REDIS_PORT);
        const c = await connect(portOf(p));
        const out = { before: await ping(c) };
        const t = await p.addToxic({ type: "latency", attributes: { latency: 300 } });
        out.downstream_300 = await ping(c);
        const u = await p.addToxic({ name: "up", type: "latency", stream: "upstream", attributes: { latency: 100, jitter: 50 } });
        out.both = await ping(c);
        await t.remove();
        await u.remove();
        out.after_remove = await ping(c);
        out.reply = (await exchange(c, PING, PONG.length))[1].toString();
        close(c);
        await p.remove();
        return out;
    },

    // bandwidth: a 300 KB GET at 100 KB/s, bytes compared.
    async bandwidth() {
        const want = await storeBig("big_bw", 300000);
        const p = await newProxy("redis_bw", REDIS_PORT);
        const c = await connect(portOf(p));
        const t = await p.addToxic({ type: "bandwidth", attributes: { rate: 100 } });
        const [ms, got] = await exchange(c, getCmd("big_bw"), want.length, 20000);
        await t.remove();
        const [fast, again] = await exchange(c, getCmd("big_bw"), want.length);
        close(c);
        await p.remove();
        return { bytes: want.length, ms, equal: got.equals(want), after_remove_ms: fast, again_equal: again.equals(want) };
    },

    // slicer: the bytes come in many small pieces, 10 ms apart, and are the same bytes.
    async slicer() {
        const want = await storeBig("big_sl", 3000);
        const p = await newProxy("redis_sl", REDIS_PORT);
        const c = await connect(portOf(p));
        await p.addToxic({ type: "slicer", attributes: { average_size: 100, size_variation: 20, delay: 10000 } });
        const chunks0 = c.chunks;
        const [ms, got] = await exchange(c, getCmd("big_sl"), want.length);
        const out = { bytes: want.length, ms, chunks: c.chunks - chunks0, equal: got.equals(want) };
        close(c);
        await p.remove();
        return out;
    },

    // limit_data: exactly N bytes, then the connection closes.
    async limit_data() {
        const want = await storeBig("big_ld", 1000);
        const p = await newProxy("redis_ld", REDIS_PORT);
        const c = await connect(portOf(p));
        await p.addToxic({ type: "limit_data", attributes: { bytes: 20 } });
        await exchange(c, getCmd("big_ld"), 1000, 3000);
        const out = { got: c.data.length, prefix_equal: c.data.equals(want.subarray(0, 20)), closed: c.ended };
        await p.remove();
        return out;
    },

    // timeout 0: nothing comes back and the connection stays; removing it closes it.
    async timeout_zero() {
        const p = await newProxy("redis_t0", REDIS_PORT);
        const c = await connect(portOf(p));
        await ping(c);
        const t = await p.addToxic({ type: "timeout", stream: "upstream", attributes: { timeout: 0 } });
        const before = c.data.length;
        c.s.write(PING);
        await sleep(1000);
        const out = { replied_in_1s: c.data.length > before, open_after_1s: !c.ended };
        await t.remove();
        out.closed_after_remove = await until(c, (x) => x.ended, 3000);
        await p.remove();
        return out;
    },

    // timeout T: no reply, and the connection closes T after the last data.
    async timeout() {
        const p = await newProxy("redis_t", REDIS_PORT);
        await p.addToxic({ type: "timeout", stream: "upstream", attributes: { timeout: 400 } });
        const c = await connect(portOf(p));
        const t0 = now();
        c.s.write(PING);
        const closed = await until(c, (x) => x.ended, 5000);
        const out = { closed, ms: c.endAt - t0, got: c.data.length, error: c.error };
        await p.remove();
        return out;
    },

    // reset_peer: the next data, then a TCP reset T later.
    async reset_peer() {
        const p = await newProxy("redis_rp", REDIS_PORT);
        await p.addToxic({ type: "reset_peer", stream: "upstream", attributes: { timeout: 300 } });
        const c = await connect(portOf(p));
        const t0 = now();
        c.s.write(PING);
        await until(c, (x) => x.ended, 5000);
        const out = { ms: c.endAt - t0, error: c.error, got: c.data.length };
        await p.remove();
        return out;
    },

    // slow_close: the broker's close reaches the client late; its data does not.
    async slow_close() {
        const p = await newProxy("redis_sc", REDIS_PORT);
        await p.addToxic({ type: "slow_close", attributes: { delay: 500 } });
        const c = await connect(portOf(p));
        const t0 = now();
        c.s.write("QUIT\r\n");
        await until(c, (x) => x.data.length >= 5, 3000);
        const dataMs = now() - t0;
        await until(c, (x) => x.ended, 5000);
        const out = { reply: c.data.toString(), data_ms: dataMs, end_ms: c.endAt - t0 };
        await p.remove();
        return out;
    },

    // down: enabled false closes the open connections and refuses new ones; true again serves.
    async down() {
        const p = await newProxy("redis_dn", REDIS_PORT);
        const c = await connect(portOf(p));
        await ping(c);
        const off = await p.update({ enabled: false });
        const out = { enabled: off.enabled, open_closed: await until(c, (x) => x.ended, 3000) };
        out.new_connect = (await connect(portOf(p))).error;
        const on = await p.update({ enabled: true });
        out.enabled_again = on.enabled;
        const d = await connect(portOf(on));
        out.reply = (await exchange(d, PING, PONG.length))[1].toString();
        close(d);
        await p.remove();
        return out;
    },

    // toxicity: 0 spares every connection; updated to 1, every open one gets it.
    async toxicity() {
        const p = await newProxy("redis_tx", REDIS_PORT);
        const t = await p.addToxic({ type: "latency", toxicity: 0, attributes: { latency: 300 } });
        const cs = [];
        for (let i = 0; i < 5; i++) cs.push(await connect(portOf(p)));
        const out = { zero: [] , one: [] };
        for (const c of cs) out.zero.push(await ping(c));
        await t.update({ toxicity: 1 });
        for (const c of cs) out.one.push(await ping(c));
        cs.forEach(close);
        await p.remove();
        return out;
    },

    // reset: every toxic off, every proxy on, the connections stay.
    async reset() {
        const p = await newProxy("redis_rs", REDIS_PORT);
        const q = await newProxy("redis_rs2", REDIS_PORT);
        await q.update({ enabled: false });
        const c = await connect(portOf(p));
        await p.addToxic({ type: "latency", attributes: { latency: 300 } });
        const out = { slow: await ping(c) };
        await toxiproxy.reset();
        out.fast = await ping(c);
        const all = await toxiproxy.getAll();
        out.enabled = [all.redis_rs.enabled, all.redis_rs2.enabled];
        out.toxics = (await toxiproxy.getApi().get(`${API}/proxies/redis_rs/toxics`)).data;
        close(c);
        await p.remove();
        await q.remove();
        return out;
    },

    // RabbitMQ through a proxy: amqplib's handshake under latency, limit_data on raw AMQP
    // bytes, and down.
    async rabbit() {
        const amqp = require("amqplib");
        const p = await newProxy("rabbit", RABBIT_PORT);
        const url = `amqp://guest:guest@127.0.0.1:${portOf(p)}`;
        const out = {};
        let t0 = now();
        let conn = await amqp.connect(url);
        out.connect_ms = now() - t0;
        await conn.close();
        const t = await p.addToxic({ type: "latency", attributes: { latency: 200 } });
        t0 = now();
        conn = await amqp.connect(url);
        out.connect_latency_ms = now() - t0;
        const ch = await conn.createChannel();
        const q = await ch.assertQueue("", { exclusive: true });
        ch.sendToQueue(q.queue, Buffer.from("hello twice"));
        let msg = false;
        for (let i = 0; i < 50 && !msg; i++) { msg = await ch.get(q.queue, { noAck: true }); if (!msg) await sleep(20); }
        out.message = msg ? msg.content.toString() : null;
        await conn.close();
        await t.remove();
        await p.addToxic({ type: "limit_data", attributes: { bytes: 100 } });
        const c = await connect(portOf(p));
        c.s.write(Buffer.from([65, 77, 81, 80, 0, 0, 9, 1]));
        out.limit_closed = await until(c, (x) => x.ended, 5000);
        out.limit_got = c.data.length;
        out.limit_frame_type = c.data[0];
        await p.update({ enabled: false });
        try { await amqp.connect(url); out.down = "connected"; } catch (e) { out.down = e.code || e.message; }
        await p.remove();
        return out;
    },
};

(async () => {
    const fn = scenarios[SCENARIO];
    if (fn === undefined) {
        console.error(`unknown scenario ${SCENARIO}: ${Object.keys(scenarios).join(", ")}`);
        process.exit(2);
    }
    const out = await fn();
    process.stdout.write(JSON.stringify(out) + "\n");
    process.exit(0);
})().catch((e) => {
    console.error(e && e.stack ? e.stack : String(e));
    process.exit(1);
});
