/** The docs' option tables are the schemas': written by `npm run docs:options`, checked here. */
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { optionTable, type OptionSchema } from '@lathe/recipes';
import { checkOptionDocs, OPTION_DOCS, REPO_ROOT, withOptionTables } from '../../../tools/docs/option-tables';

test('optionTable: option, default and meaning, with choices, integer kinds and ranges; markdown escaped', () => {
  const schema = {
    steps: { type: 'number', default: 1000, integer: true, min: 1, describe: 'Optimizer steps' },
    lr: { type: 'number', default: 2e-5, min: 0, describe: 'Peak learning rate' },
    dropout: { type: 'number', default: 0, min: 0, below: 1, describe: 'Dropout' },
    ratio: { type: 'number', default: 0.1, min: 0, max: 1, describe: 'A fraction' },
    coef: { type: 'number', default: 0, describe: 'Any number' },
    mode: { type: 'string', default: 'raw', choices: ['raw', 'chat', 'r1_zero'], describe: 'How prompts read' },
    targets: { type: 'string', default: 'q|k', describe: 'Names like *_proj matching a|b, see `x|y`, written to <name>.parts/' },
    out: { type: 'string', default: '', describe: 'Folder [required]' },
    resume: { type: 'boolean', default: false, describe: 'Continue' },
  } as const satisfies OptionSchema;
  expect(optionTable(schema).split('\n')).toEqual([
    '| option | default | meaning |',
    '| --- | --- | --- |',
    '| `steps` | `1000` | Optimizer steps — integer ≥ 1 |',
    '| `lr` | `2e-5` | Peak learning rate — number ≥ 0 |',
    '| `dropout` | `0` | Dropout — number in [0, 1) |',
    '| `ratio` | `0.1` | A fraction — number in [0, 1] |',
    '| `coef` | `0` | Any number |',
    '| `mode` | `raw` | How prompts read — `raw`, `chat` or `r1_zero` |',
    '| `targets` | `q\\|k` | Names like \\*_proj matching a\\|b, see `x\\|y`, written to &lt;name>.parts/ |',
    '| `out` | — | Folder [required] |',
    '| `resume` | `false` | Continue |',
  ]);
});

test("every doc's option tables equal the schemas (npm run docs:options rewrites them), and every schema has one", () => {
  expect(checkOptionDocs()).toEqual({ stale: [], untabulated: [] });
});

test('a table that differs from its schema (here a default the code no longer has) names its doc', () => {
  const root = mkdtempSync(join(tmpdir(), 'lathe-option-docs-'));
  for (const doc of OPTION_DOCS) cpSync(join(REPO_ROOT, doc), join(root, doc));
  const sft = join(root, 'docs/guides/sft.md');
  writeFileSync(sft, readFileSync(sft, 'utf8').replace('| `steps` | `1000` |', '| `steps` | `400` |'));
  expect(checkOptionDocs(root).stale).toEqual(['docs/guides/sft.md']);
});

test('a marker naming no schema is an error naming the doc', () => {
  expect(() => withOptionTables('<!-- options: nope -->\n<!-- /options -->', 'docs/x.md')).toThrow(/docs\/x\.md: <!-- options: nope --> names no schema/);
});
