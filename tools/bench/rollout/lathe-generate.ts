/**
 * Generates completions for a batch of prompts with Lathe's generation graph (prefill + in-graph
 * decode loop) from a Hugging Face folder, on CUDA or CPU, and reports tokens/s.
 *
 * usage: node lathe-generate.js --model DIR --prompts prompts.json --max-new N --dtype float32|bfloat16
 *          [--device cuda|cpu] [--temperature T] [--group N] [--repeat N] [--out tokens.json] [--profile PREFIX]
 * prompts.json: [[ids...], ...] (left-padded here). With no stop ids every row runs to --max-new,
 * so the token count is exact. Prints one JSON line.
 */
import { writeFileSync } from 'node:fs';
import { readFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import * as ort from 'onnxruntime-node';
import * as L from '@lathe/onnx';
import { externalDataFolder, readConfig, readWeightIndex, weightInitializers } from '@lathe/models';
import { addGeneration, uniformNoise } from '@lathe/rollout';
import { arg } from '../argv';


async function main(): Promise<void> {
  const dir = resolve(arg('model'));
  const dtype = arg('dtype', 'bfloat16') as L.DType;
  const device = arg('device', 'cuda');
  const maxNew = Number(arg('max-new', '128'));
  const temperature = Number(arg('temperature', '0'));
  const group = Number(arg('group', '1'));
  const repeat = Number(arg('repeat', '3'));
  const prompts = JSON.parse(readFileSync(arg('prompts'), 'utf8')) as number[][];
  const { config } = readConfig(dir);

  const t0 = performance.now();
  const g = new L.Graph('lathe_generate');
  const index = readWeightIndex(dir);
  const { dir: work, location } = externalDataFolder([...index.values()].map((e) => e.file));
  addGeneration(g, config, weightInitializers(g, config, index, dtype, location), { temperature, groupSize: group });
  const modelPath = join(work, 'generate.onnx');
  writeFileSync(modelPath, L.toModelBytes(g));
  const tBuild = performance.now();
  const session = await ort.InferenceSession.create(modelPath, {
    executionProviders: device === 'cuda' ? [{ name: 'cuda', deviceId: 0 }] : ['cpu'],
    graphOptimizationLevel: 'all',
    extra: { session: { disable_cpu_ep_fallback: device === 'cuda' ? '1' : '0' } },
    // --profile PREFIX: ORT writes a chrome-trace JSON of every node run (summarise with
    // tools/bench/rollout/profile_summary.py).
    ...(arg('profile', '') ? { enableProfiling: true, profileFilePrefix: arg('profile', '') } : {}),
  });
  const tSession = performance.now();
  const B = prompts.length;
  const P = Math.max(...prompts.map((p) => p.length));
  const ids = prompts.flatMap((p) => [...new Array(P - p.length).fill(0), ...p]);
  const mask = prompts.flatMap((p) => [...new Array(P - p.length).fill(0), ...p.map(() => 1)]);
  const rows = B * group;
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [B, P]),
    attention_mask: new ort.Tensor('int64', BigInt64Array.from(mask.map(BigInt)), [B, P]),
    max_new_tokens: new ort.Tensor('int64', BigInt64Array.from([BigInt(maxNew)]), []),
    stop_ids: new ort.Tensor('int64', BigInt64Array.from([-1n]), [1]),
  };
  if (temperature > 0) feeds.noise = new ort.Tensor('float32', uniformNoise(1, [...Array(rows).keys()], maxNew), [rows, maxNew]);
  let out = await session.run(feeds); // warm-up
  const times: number[] = [];
  for (let i = 0; i < repeat; i++) {
    const s = performance.now();
    out = await session.run(feeds);
    times.push(performance.now() - s);
  }
  if (arg('profile', '')) session.endProfiling();
  const N = out.tokens.dims[1];
  const tokens = Array.from({ length: rows }, (_, r) => Array.from((out.tokens.data as BigInt64Array).slice(r * N, (r + 1) * N), Number));
  const outPath = arg('out', '');
  if (outPath) writeFileSync(outPath, JSON.stringify(tokens));
  const best = Math.min(...times);
  console.log(
    JSON.stringify({
      model: basename(dir),
      dtype,
      device,
      prompts: [B, P],
      group,
      new_tokens: N,
      build_ms: +(tBuild - t0).toFixed(1),
      session_ms: +(tSession - tBuild).toFixed(1),
      run_ms_best: +best.toFixed(1),
      run_ms_all: times.map((t) => +t.toFixed(1)),
      new_tokens_per_s: Math.round((rows * N) / (best / 1000)),
    }),
  );
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : e);
  process.exit(1);
});
