// Loaded with `node --require` before amqplib's own test suite (tests/integration/test_peers_amqp.py).
// The suite connects to "the broker on localhost": with no URL at all (its callback API tests),
// or to amqp://localhost and {hostname: 'localhost'} with no port (its connect tests), meaning
// 5672.  This points every such connection at the broker under test, given as TWICE_SUITE_URL
// (RabbitMQ itself, or a twice listener in front of it), so that the suite never touches a port
// the test did not choose.  A URL naming a port (the suite's own fake servers) is left alone;
// so is an IPv6 host (its `ipv6` test), which keeps its own host and gets the port under test.
'use strict';
const path = require('node:path');

const target = new URL(process.env.TWICE_SUITE_URL);
const connectModule = require(path.join(process.env.TWICE_SUITE_DIR, 'lib', 'connect.js'));
const originalConnect = connectModule.connect;
const isLocal = (host) => host === undefined || host === '' || host === 'localhost' || host === '127.0.0.1';

function redirect(url) {
  if (!url) return target.href;
  if (typeof url === 'object') {
    if (url.port !== undefined || !isLocal(url.hostname)) return url;
    return Object.assign({}, url, { hostname: target.hostname, port: Number(target.port) });
  }
  let u;
  try {
    u = new URL(url);
  } catch (_e) {
    return url; // not a URL: the suite checks the error it gets
  }
  if (u.protocol !== 'amqp:' || u.port !== '') return url;
  if (isLocal(u.hostname)) u.hostname = target.hostname;
  u.port = target.port;
  return u.href;
}

// callback_api.js and channel_api.js take connect() from this module when they are loaded,
// which is after this file ran.
connectModule.connect = (url, socketOptions, openCallback) =>
  originalConnect(redirect(url), socketOptions, openCallback);
