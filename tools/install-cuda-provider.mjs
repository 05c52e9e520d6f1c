#!/usr/bin/env node
// Installs ONNX Runtime's CUDA execution provider beside onnxruntime-node's libonnxruntime.so.1.
//
// onnxruntime-node's own install script downloads the CUDA 12 provider from a NuGet feed
// (`npm rebuild onnxruntime-node --onnxruntime-node-install=cuda12` where that feed is reachable).
// For CUDA 13 machines, or where NuGet is unreachable, this script takes the provider built for
// CUDA 13 from the npm package com.github.asus4.onnxruntime.linux-x64-gpu, checks that its ONNX
// Runtime version equals onnxruntime-node's (core library and provider must match exactly), and
// copies libonnxruntime_providers_cuda.so and libonnxruntime_providers_shared.so into place
// atomically (temporary file + rename). Then run `lathe doctor`.
//
// usage: node tools/install-cuda-provider.mjs [--package SPEC] [--from FILE.tgz|DIR] [--dest DIR]
//                                            [--force] [--dry-run]
//   --package  npm spec to fetch with `npm pack` (default com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9)
//   --from     use an already downloaded package tarball or unpacked folder instead
//   --dest     where libonnxruntime.so.1 lives (default: onnxruntime-node's linux/x64 binding folder)
//   --force    install even when the versions differ (sessions will then fail to load the provider)
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, readFileSync, renameSync, rmSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';

const DEFAULT_PACKAGE = 'com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9';
const FILES = ['libonnxruntime_providers_cuda.so', 'libonnxruntime_providers_shared.so'];

const argv = process.argv.slice(2);
if (argv.includes('--help') || argv.includes('-h')) {
  console.log(readFileSync(new URL(import.meta.url), 'utf8').split('\n').filter((l) => l.startsWith('//')).map((l) => l.slice(3)).join('\n'));
  process.exit(0);
}
const opt = (name, fallback) => {
  const i = argv.indexOf(`--${name}`);
  if (i < 0) return fallback;
  if (argv[i + 1] === undefined || argv[i + 1].startsWith('--')) fail(`--${name} needs a value`);
  return argv[i + 1];
};
const known = new Set(['--package', '--from', '--dest', '--force', '--dry-run', '--help', '-h']);
for (let i = 0; i < argv.length; i++) {
  if (!argv[i].startsWith('-')) continue;
  if (!known.has(argv[i])) fail(`unknown option ${argv[i]} (see --help)`);
}

function fail(msg) {
  console.error(`install-cuda-provider: ${msg}`);
  process.exit(1);
}

if (process.platform !== 'linux' || process.arch !== 'x64') fail(`this installer handles Linux x64 only (this is ${process.platform} ${process.arch})`);

const require = createRequire(import.meta.url);
let ortPkgDir;
try {
  ortPkgDir = dirname(require.resolve('onnxruntime-node/package.json'));
} catch {
  fail('onnxruntime-node is not installed here (run npm ci first)');
}
const ortVersion = JSON.parse(readFileSync(join(ortPkgDir, 'package.json'), 'utf8')).version;
const dest = resolve(opt('dest', join(ortPkgDir, 'bin', 'napi-v6', 'linux', 'x64')));
if (!existsSync(join(dest, 'libonnxruntime.so.1'))) fail(`${dest} has no libonnxruntime.so.1 (pass --dest)`);

// 1. the package: a folder with Plugins/Linux/x64/*.so
const work = mkdtempSync(join(tmpdir(), 'lathe-cuda-ep-'));
let pkgDir;
const from = opt('from');
if (from && statSync(from).isDirectory()) pkgDir = resolve(from);
else {
  let tgz = from ? resolve(from) : undefined;
  if (!tgz) {
    const spec = opt('package', DEFAULT_PACKAGE);
    console.log(`fetching ${spec} from the npm registry…`);
    try {
      const name = execFileSync('npm', ['pack', spec, '--silent', '--pack-destination', work], { encoding: 'utf8' }).trim().split('\n').pop();
      tgz = join(work, name);
    } catch (e) {
      fail(`npm pack ${spec} failed: ${e.message}`);
    }
  }
  execFileSync('tar', ['xzf', tgz, '-C', work]);
  pkgDir = join(work, 'package');
}
const pluginDir = join(pkgDir, 'Plugins', 'Linux', 'x64');
for (const f of FILES) if (!existsSync(join(pluginDir, f))) fail(`${pluginDir} has no ${f}: not a Linux x64 GPU provider package`);

// 2. its ONNX Runtime version: the package README states it; the provider binary embeds it
const readme = existsSync(join(pkgDir, 'README.md')) ? readFileSync(join(pkgDir, 'README.md'), 'utf8') : '';
const stated = /ONNX Runtime:\s*\[?(\d+\.\d+\.\d+)/.exec(readme)?.[1];
const binary = readFileSync(join(pluginDir, 'libonnxruntime_providers_shared.so')).toString('latin1');
const embedded = [...new Set(binary.match(/\b1\.\d{1,2}\.\d{1,2}\b/g) ?? [])];
const providerVersion = stated ?? (embedded.length === 1 ? embedded[0] : undefined);
console.log(`onnxruntime-node ${ortVersion}; provider package built for ONNX Runtime ${providerVersion ?? 'unknown'}`);
if (providerVersion !== ortVersion) {
  const msg = `version mismatch: onnxruntime-node is ${ortVersion} but the provider is ${providerVersion ?? 'of unknown version'}; ORT loads only a provider of its own version`;
  if (!argv.includes('--force')) fail(`${msg} (--force to install anyway)`);
  console.warn(`warning: ${msg}`);
}

// 3. copy into place, each file through a temporary name in the same folder
for (const f of FILES) {
  const target = join(dest, f);
  if (argv.includes('--dry-run')) {
    console.log(`would install ${target}`);
    continue;
  }
  const tmp = `${target}.tmp-${process.pid}`;
  copyFileSync(join(pluginDir, f), tmp);
  renameSync(tmp, target);
  console.log(`installed ${target} (${(statSync(target).size / 1e6).toFixed(1)} MB)`);
}
rmSync(work, { recursive: true, force: true });

// 4. the CUDA libraries the provider links against
const needed = ['libcudart.so.13', 'libcublas.so.13', 'libcublasLt.so.13', 'libcurand.so.10', 'libcuda.so.1'];
let cache = '';
try {
  cache = execFileSync('ldconfig', ['-p'], { encoding: 'utf8' });
} catch {
  // ldconfig missing: fall back to LD_LIBRARY_PATH only
}
const searchPath = (process.env.LD_LIBRARY_PATH ?? '').split(':').filter(Boolean);
const missing = needed.filter((lib) => !cache.includes(lib) && !searchPath.some((d) => existsSync(join(d, lib))));
if (missing.length) console.warn(`note: not found on this machine: ${missing.join(', ')} — install CUDA 13 (and the NVIDIA driver), or add their folder to LD_LIBRARY_PATH`);
console.log('done: check with `node apps/trainer/bin/lathe.cjs doctor`');
