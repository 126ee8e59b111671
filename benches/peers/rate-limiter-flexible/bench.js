// rate-limiter-flexible's RateLimiterRedis (ioredis client) under the load `cargo xtask bench` gives
// tollgate's RedisStore: `callers` concurrent callers, each request for a random one of
// `clients` clients, 100 points per 60 s per client, for `seconds`. Prints one JSON line:
// decisions/s, p50/p99 latency in microseconds.
//
// node bench.js --url redis://127.0.0.1:PORT [--callers 64] [--clients 100000] [--seconds 10]
'use strict';
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

function parse() {
  const a = { url: '', callers: 64, clients: 100000, seconds: 10 };
  const argv = process.argv.slice(2);
  for (let i = 0; i + 1 < argv.length; i += 2) {
    const v = argv[i + 1];
    switch (argv[i]) {
      case '--url': a.url = v; break;
      case '--callers': a.callers = Math.min(4096, Math.max(1, parseInt(v, 10))); break;
      case '--clients': a.clients = Math.max(1, parseInt(v, 10)); break;
      case '--seconds': a.seconds = Math.min(600, Math.max(1, parseInt(v, 10))); break;
      default: console.error(`unknown flag ${argv[i]}`); process.exit(2);
    }
  }
  if (!a.url) { console.error('--url is required'); process.exit(2); }
  return a;
}

async function phase(limiter, a, seconds) {
  const end = process.hrtime.bigint() + BigInt(Math.round(seconds * 1e9));
  const start = process.hrtime.bigint();
  const lat = [];
  let limited = 0;
  async function caller() {
    // Bounded: at most 10 million requests per caller.
    for (let n = 0; n < 10000000; n++) {
      if (process.hrtime.bigint() >= end) return;
      const key = String(Math.floor(Math.random() * a.clients));
      const t = process.hrtime.bigint();
      try {
        await limiter.consume(key, 1);
      } catch (e) {
        if (e instanceof Error) { console.error(`rate-limiter-flexible: ${e.message}`); process.exit(1); }
        limited++;
      }
      lat.push(Number(process.hrtime.bigint() - t) / 1000);
    }
  }
  await Promise.all(Array.from({ length: a.callers }, caller));
  return { elapsed: Number(process.hrtime.bigint() - start) / 1e9, lat, limited };
}

async function main() {
  const a = parse();
  const redis = new Redis(a.url, { enableOfflineQueue: true, maxRetriesPerRequest: 1 });
  const limiter = new RateLimiterRedis({
    storeClient: redis, keyPrefix: 'rlf-bench', points: 100, duration: 60,
  });
  await phase(limiter, a, Math.max(0.5, a.seconds / 10));
  const { elapsed, lat, limited } = await phase(limiter, a, a.seconds);
  lat.sort((x, y) => x - y);
  const pct = (p) => (lat.length ? Math.round(lat[Math.min(lat.length - 1, Math.floor(lat.length * p))]) : 0);
  console.log(JSON.stringify({
    decisions_per_s: Math.round(lat.length / elapsed), p50_us: pct(0.5), p99_us: pct(0.99),
    requests: lat.length, limited, callers: a.callers, clients: a.clients, seconds: Number(elapsed.toFixed(2)),
  }));
  redis.disconnect();
}

main().catch((e) => { console.error(e); process.exit(1); });
