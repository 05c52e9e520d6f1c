/**
 * Writes each command's option table in the docs from its option schema, so a guide says what the
 * code does. A table sits between `<!-- options: NAME -->` and `<!-- /options -->`, NAME one of
 * {@link OPTION_SCHEMAS}; the lines between are replaced by `optionTable(schema)`.
 *
 * Usage: npm run docs:options            rewrite the tables
 *        npm run docs:options -- --check  exit 1 naming each doc whose tables are stale
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  criticEvalSchema,
  criticLabelSchema,
  criticTrainSchema,
  dpoSchema,
  evalSchema,
  extractEvalSchema,
  extractGenerateSchema,
  extractRftSchema,
  extractTrainSchema,
  generateSchema,
  grpoSchema,
  modelInitSchema,
  optionTable,
  quantizeEvalSchema,
  quantizeSchema,
  rmEvalSchema,
  rmTrainSchema,
  runsDiffSchema,
  runsListSchema,
  runsPruneSchema,
  runsShowSchema,
  serveSchema,
  sftSchema,
  studioSchema,
  launchSchema,
  type OptionSchema,
} from '@lathe/recipes';

/** The schema of each command whose options the docs tabulate, by marker name. */
export const OPTION_SCHEMAS: Readonly<Record<string, OptionSchema>> = {
  sft: sftSchema,
  grpo: grpoSchema,
  generate: generateSchema,
  'model-init': modelInitSchema,
  'rm-train': rmTrainSchema,
  'rm-eval': rmEvalSchema,
  dpo: dpoSchema,
  eval: evalSchema,
  'runs-list': runsListSchema,
  'runs-show': runsShowSchema,
  'runs-diff': runsDiffSchema,
  'runs-prune': runsPruneSchema,
  serve: serveSchema,
  quantize: quantizeSchema,
  'quantize-eval': quantizeEvalSchema,
  'critic-train': criticTrainSchema,
  'critic-label': criticLabelSchema,
  'critic-eval': criticEvalSchema,
  'extract-generate': extractGenerateSchema,
  'extract-train': extractTrainSchema,
  'extract-rft': extractRftSchema,
  'extract-eval': extractEvalSchema,
  studio: studioSchema,
  launch: launchSchema,
};

/** The docs holding option tables, relative to the repository root. */
export const OPTION_DOCS = ['docs/guides/sft.md', 'docs/guides/grpo.md', 'docs/guides/generate.md', 'docs/guides/model-init.md', 'docs/guides/rm.md', 'docs/guides/dpo.md', 'docs/guides/eval.md', 'docs/guides/quantize.md', 'docs/guides/serve.md', 'docs/data.md', 'docs/guides/critic.md', 'docs/guides/extract.md', 'docs/guides/studio.md', 'docs/guides/launch.md'];

/** The repository root. */
export const REPO_ROOT = join(__dirname, '..', '..');

const MARKED_TABLE = /(<!-- options: ([\w-]+) -->)[\s\S]*?(<!-- \/options -->)/g;

/** `text` with every marked table written from its schema; an unknown name is an error naming the doc. */
export function withOptionTables(text: string, doc: string): string {
  return text.replace(MARKED_TABLE, (_all, open: string, name: string, close: string) => {
    const schema = OPTION_SCHEMAS[name];
    if (!schema) throw new Error(`${doc}: <!-- options: ${name} --> names no schema (known: ${Object.keys(OPTION_SCHEMAS).join(', ')})`);
    return `${open}\n${optionTable(schema)}\n${close}`;
  });
}

/** The marker names in `text`, in order. */
export function markedTables(text: string): string[] {
  return [...text.matchAll(MARKED_TABLE)].map((m) => m[2]);
}

/** Checks every doc; returns the stale ones, and the schemas no doc tabulates. */
export function checkOptionDocs(root = REPO_ROOT): { stale: string[]; untabulated: string[] } {
  const stale: string[] = [];
  const seen = new Set<string>();
  for (const doc of OPTION_DOCS) {
    const text = readFileSync(join(root, doc), 'utf8');
    markedTables(text).forEach((n) => seen.add(n));
    if (withOptionTables(text, doc) !== text) stale.push(doc);
  }
  return { stale, untabulated: Object.keys(OPTION_SCHEMAS).filter((n) => !seen.has(n)) };
}

function main(args: string[]): number {
  if (args.includes('--check')) {
    const { stale, untabulated } = checkOptionDocs();
    for (const doc of stale) process.stderr.write(`${doc}: option tables differ from the schemas (run npm run docs:options)\n`);
    for (const n of untabulated) process.stderr.write(`no doc has <!-- options: ${n} -->\n`);
    return stale.length || untabulated.length ? 1 : 0;
  }
  for (const doc of OPTION_DOCS) {
    const file = join(REPO_ROOT, doc);
    const text = readFileSync(file, 'utf8');
    const next = withOptionTables(text, doc);
    if (next !== text) {
      writeFileSync(file, next);
      process.stdout.write(`${doc}: option tables written\n`);
    }
  }
  return 0;
}

if (require.main === module) process.exitCode = main(process.argv.slice(2));
