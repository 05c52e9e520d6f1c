/**
 * The prefill's time per call shape on `lathe generate`'s KV-cache engine, for a dense folder and
 * quantized ones: each `--calls` entry `BxP` is one generate call of B prompts of P tokens (1 new
 * token), timed by the engine's own prefill clock (`lastTimings.prefillMs`). A shape's first call
 * beside its repeats shows what a new prefill shape costs each format (ONNX Runtime's per-shape
 * work, CUDA-graph capture where on), which a long steady-state benchmark never sees. The weights
 * run as `lathe generate --quantized_weights auto` runs them (`planModelWeights`, `engineWeights`).
 *
 * usage: node prefill-shapes.js [--shape qwen3-0.6b|tiny] [--device cuda|cpu] [--formats none,int4,int8]
 *          [--rows 16] [--calls 1x243,16x243,16x243,16x128,16x128,8x200] [--graph both|on|off] [--profile DIR]
 * --profile: ONNX Runtime's profile of each engine's sessions into DIR (which node a new shape's first run waits on).
 * Prints one JSON line per format and graph mode: each call's prefill ms.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MODEL_PRESETS, randomModel, readConfig, type HfConfig } from '@lathe/models';
import { isQuantizedConfig, schemeFromConfig } from '@lathe/quantization';
import { cudaDecodeFacts, engineWeights, kernelsOfDevice, openDevice, planModelWeights } from '@lathe/recipes';
import { arg } from '../argv';
import { QWEN3_0_6B } from '../shapes';
import { quantizedFolder } from './quantized-folder';

const SHAPES: Record<string, HfConfig> = { tiny: MODEL_PRESETS['tiny-qwen3'].config, 'qwen3-0.6b': QWEN3_0_6B };

async function main(): Promise<void> {
  const shape = arg('shape', 'qwen3-0.6b');
  const hf = SHAPES[shape];
  if (!hf) throw new Error(`--shape: '${shape}' is not one of ${Object.keys(SHAPES).join(', ')}`);
  const kind = arg('device', 'cuda') as 'cuda' | 'cpu';
  const dtype = kind === 'cuda' ? 'bfloat16' : 'float32';
  const rows = Number(arg('rows', '16'));
  const calls = arg('calls', '1x243,16x243,16x243,16x128,16x128,8x200').split(',').map((c) => {
    const [b, p] = c.split('x').map(Number);
    if (!(b >= 1 && b <= rows && p >= 1)) throw new Error(`--calls: '${c}' is not BxP with 1 ≤ B ≤ --rows`);
    return { b, p };
  });
  const graphArg = arg('graph', 'both');
  const graphs = kind !== 'cuda' ? [false] : graphArg === 'both' ? [true, false] : [graphArg === 'on'];
  const profile = arg('profile', '');
  const dir = mkdtempSync(join(tmpdir(), 'lathe-prefill-shapes-'));
  randomModel(dir, hf, { seed: 1, std: 0.02 });
  const device = openDevice(kind);
  const maxLength = Math.ceil((Math.max(...calls.map((c) => c.p)) + 2) / 64) * 64;
  for (const format of arg('formats', 'none,int4,int8').split(',')) {
    const folder = quantizedFolder(dir, format);
    const { config, raw } = readConfig(folder);
    const scheme = isQuantizedConfig(raw) ? schemeFromConfig(raw, join(folder, 'config.json')) : undefined;
    const facts = kind === 'cuda' ? cudaDecodeFacts(config, dtype, undefined) : {};
    const { runs } = planModelWeights(scheme, { request: 'auto', device: kind, dtype, engine: { engine: 'kv-cache' }, kernelsUnavailable: facts.kernelsUnavailable });
    const weights = engineWeights(folder, device, dtype, runs, kernelsOfDevice(0));
    try {
      for (const cudaGraph of graphs) {
        const gen = weights.create({ temperature: 0, rows, maxLength, dtype, padTokenId: 0, cudaGraph, ...(profile ? { session: { profilePrefix: join(profile, `${format}-`) } } : {}) });
        const out: { call: string; prefill_ms: number; wall_ms: number }[] = [];
        try {
          for (const { b, p } of calls) {
            const prompts = Array.from({ length: b }, (_, i) => Array.from({ length: p }, (_, j) => 1 + ((i * 131 + j * 17) % (config.vocabSize - 1))));
            const t = performance.now();
            await gen.generate(prompts, { maxNewTokens: 1, seed: 0, stopIds: [] });
            out.push({ call: `${b}x${p}`, prefill_ms: +gen.lastTimings.prefillMs.toFixed(1), wall_ms: +(performance.now() - t).toFixed(1) });
          }
          if (profile) console.log(JSON.stringify({ profiles: gen.endProfiling() }));
        } finally {
          gen.dispose();
        }
        console.log(JSON.stringify({ bench: 'prefill-shapes', shape, format, runs, cuda_graph: cudaGraph, rows, calls: out }));
      }
    } finally {
      weights.dispose();
    }
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
