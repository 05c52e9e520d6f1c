/**
 * The package's modules form a layered graph: no import cycle among packages/onnx/src files (type-only
 * imports included), and every import at the top of its file. Imports are read line by line from
 * the sources, as prettier formats them (top-level statements at column 0).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

const SRC = resolve(__dirname, '../src');

/** What one file imports: relative specifiers, and the lines of imports below its first other statement. */
interface FileImports {
  specifiers: string[];
  late: { line: number; text: string }[];
}

/**
 * Reads the import and export-from statements of a TypeScript source. Imports and re-exports at
 * the start of the file (after comments) are its header; one met after any other top-level
 * statement is late.
 */
function readImports(source: string): FileImports {
  const lines = source.split('\n');
  const specifiers: string[] = [];
  const late: FileImports['late'] = [];
  let inHeader = true;
  let inComment = false;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (inComment) {
      inComment = !line.includes('*/');
      continue;
    }
    if (line.startsWith('/*')) {
      inComment = !line.includes('*/');
      continue;
    }
    if (line.trim() === '' || line.startsWith('//')) continue;
    const isImport = /^import[\s{'"*]/.test(line) || /^export\s+(\*|\{|type\s+\{)/.test(line);
    const statement = isImport ? collectStatement(lines, i) : undefined;
    const from = statement?.text.match(/(?:\bfrom\s*|^import\s*)['"]([^'"]+)['"]/);
    if (statement && from) {
      if (from[1].startsWith('.')) specifiers.push(from[1]);
      if (!inHeader) late.push({ line: i + 1, text: line.trim() });
      i = statement.end;
      continue;
    }
    inHeader = false;
  }
  return { specifiers, late };
}

/** The statement starting at line `start`: its text up to the line ending in `;`. */
function collectStatement(lines: string[], start: number): { text: string; end: number } {
  let end = start;
  while (end < lines.length - 1 && !lines[end].trimEnd().endsWith(';')) end++;
  return { text: lines.slice(start, end + 1).join('\n'), end };
}

/** A cycle in a directed graph as the list of its nodes (first repeated at the end), or undefined. */
function findCycle(edges: Map<string, string[]>): string[] | undefined {
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (node: string): string[] | undefined => {
    if (state.get(node) === 'done') return undefined;
    if (state.get(node) === 'open') return [...stack.slice(stack.indexOf(node)), node];
    state.set(node, 'open');
    stack.push(node);
    for (const next of edges.get(node) ?? []) {
      const cycle = visit(next);
      if (cycle) return cycle;
    }
    stack.pop();
    state.set(node, 'done');
    return undefined;
  };
  for (const node of [...edges.keys()].sort()) {
    const cycle = visit(node);
    if (cycle) return cycle;
  }
  return undefined;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? sourceFiles(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : []));
}

/** Every src file's imports, keyed and resolved relative to src/. */
function packageImports(): Map<string, FileImports & { targets: string[] }> {
  const files = sourceFiles(SRC);
  const known = new Set(files.map((f) => relative(SRC, f)));
  const result = new Map<string, FileImports & { targets: string[] }>();
  for (const file of files) {
    const imports = readImports(readFileSync(file, 'utf8'));
    const targets = imports.specifiers.map((spec) => {
      const base = relative(SRC, resolve(dirname(file), spec));
      const target = [`${base}.ts`, join(base, 'index.ts')].find((t) => known.has(t));
      if (!target) throw new Error(`${relative(SRC, file)}: cannot resolve '${spec}'`);
      return target;
    });
    result.set(relative(SRC, file), { ...imports, targets });
  }
  return result;
}

test('the checks catch a cycle and a late import', () => {
  const a = readImports("/** a */\nimport { b } from './b';\n\nexport const a = 1;\nimport { c } from './c';\n");
  expect(a).toEqual({ specifiers: ['./b', './c'], late: [{ line: 5, text: "import { c } from './c';" }] });
  const multiline = readImports("import type { X } from '../x';\nimport {\n  y,\n  z,\n} from './y';\nexport { w } from './w';\nexport * from 'pkg';\nimport './side';\n");
  expect(multiline).toEqual({ specifiers: ['../x', './y', './w', './side'], late: [] });
  const edges = new Map([
    ['a', ['b']],
    ['b', ['c']],
    ['c', ['a']],
  ]);
  expect(findCycle(edges)).toEqual(['a', 'b', 'c', 'a']);
  expect(findCycle(new Map([['a', ['b']], ['b', []]]))).toBeUndefined();
});

test('no import cycle among the source files', () => {
  const imports = packageImports();
  expect(imports.get('index.ts')!.targets.length).toBeGreaterThan(10);
  const edges = new Map([...imports].map(([file, i]) => [file, i.targets]));
  const cycle = findCycle(edges);
  expect(cycle?.join(' → ')).toBeUndefined();
});

test('every import is at the top of its file', () => {
  const late = [...packageImports()].flatMap(([file, i]) => i.late.map((l) => `${file}:${l.line} ${l.text}`));
  expect(late).toEqual([]);
});
