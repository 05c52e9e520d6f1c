#!/usr/bin/env node
// The npm registry reachable here serves only the platform packages for this machine (other
// platforms' optional binaries, e.g. @swc/core-darwin-arm64, answer 404), so `npm install` leaves
// them out of package-lock.json and `npm ci` then rejects the lock as out of sync. This adds the
// missing optional entries (version only: npm skips or fetches them per platform at install time).
// Run after changing dependencies: `npm run lock`.
import { readFileSync, writeFileSync } from 'node:fs';

const lock = JSON.parse(readFileSync('package-lock.json', 'utf8'));
const packages = lock.packages;
let added = 0;
for (const [path, entry] of Object.entries(packages)) {
  if (!path.includes('node_modules/')) continue;
  let meta;
  try {
    meta = JSON.parse(readFileSync(`${path}/package.json`, 'utf8'));
  } catch {
    continue; // not installed on this platform
  }
  for (const [dep, version] of Object.entries(meta.optionalDependencies ?? {})) {
    const key = `node_modules/${dep}`;
    const nested = `${path}/node_modules/${dep}`;
    if (packages[key] || packages[nested]) continue;
    packages[key] = { version, optional: true, ...(entry.dev ? { dev: true } : {}) };
    added++;
  }
}
const sorted = Object.fromEntries(Object.entries(packages).sort(([a], [b]) => (a === '' ? -1 : b === '' ? 1 : a < b ? -1 : 1)));
lock.packages = sorted;
writeFileSync('package-lock.json', `${JSON.stringify(lock, null, 2)}\n`);
console.log(`complete-lockfile: added ${added} optional platform entries`);
