#!/usr/bin/env node
// Every package a Lathe library's compiled code imports must be in its package.json dependencies:
// in a user's project npm hoists packages, so an undeclared import can work by accident and break
// in another install. Reads each installed package's dist/**/*.js (require("x") and import('x')).
// usage: node tools/consumer/check-imports.mjs node_modules/@lathe
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { join } from 'node:path';

const scope = process.argv[2];
if (!scope) throw new Error('usage: check-imports.mjs <folder of installed @lathe packages>');
const builtins = new Set(builtinModules);

/** The package a module specifier names (`@a/b/c` → `@a/b`, `x/y` → `x`), or null for relative and built-in ones. */
function packageOf(spec) {
  if (spec.startsWith('.') || spec.startsWith('node:') || builtins.has(spec.split('/')[0])) return null;
  return spec.split('/').slice(0, spec.startsWith('@') ? 2 : 1).join('/');
}

function* jsFiles(dir) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) yield* jsFiles(p);
    else if (name.endsWith('.js')) yield p;
  }
}

const problems = [];
for (const name of readdirSync(scope)) {
  const dir = join(scope, name);
  const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
  const declared = new Set([...Object.keys(pkg.dependencies ?? {}), ...Object.keys(pkg.peerDependencies ?? {})]);
  for (const file of jsFiles(join(dir, 'dist'))) {
    const code = readFileSync(file, 'utf8');
    for (const m of code.matchAll(/\brequire\("([^"]+)"\)|\bimport\('([^']+)'\)/g)) {
      const used = packageOf(m[1] ?? m[2]);
      if (used && used !== pkg.name && !declared.has(used)) problems.push(`${pkg.name}: ${file} imports ${used}, which is not in its package.json dependencies`);
    }
  }
  for (const [dep, range] of Object.entries(pkg.dependencies ?? {})) {
    if (dep.startsWith('@lathe/') && range !== pkg.version) problems.push(`${pkg.name}: dependency ${dep} is "${range}", expected the exact version ${pkg.version} (the packages are released together)`);
  }
}
if (problems.length) {
  console.error(problems.join('\n'));
  process.exit(1);
}
console.log(`check-imports: every import of ${readdirSync(scope).length} packages is declared`);
