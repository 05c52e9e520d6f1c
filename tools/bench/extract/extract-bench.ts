/**
 * Policy-extraction speed at a model preset's shape with random weights (Qwen3-0.6B on the GPU), in
 * one process: Q-weighted generation tokens/s at each --batches (both models over KV caches, and
 * with the prefix recomputed every step) against plain generation (the KV-cache engine's min-p
 * sampling, and π_ref's sampling through the same step models without the critic, which separates
 * the critic's cost from the step machinery's), and the KL-distillation train step's tokens/s (with
 * the candidate-mass term, as `lathe extract train` runs it, and the KL alone) against the SFT step
 * on the same rows.
 *
 * usage: node extract-bench.js [--preset qwen3-0.6b] [--device cuda] [--compute bfloat16]
 *          [--batches 64,256] [--prompt 64] [--new-tokens 128] [--min-p 0.1] [--max-candidates 4]
 *          [--tau 0.1] [--train-rows 8] [--train-length 1024] [--train-candidates 4] [--steps 5]
 *          [--seed 1] [--no-kv-cache] [--no-recompute]
 * Random weights give nearly flat next-token distributions, so min-p keeps every token up to
 * --max-candidates: its default 4 stands for a trained policy's typical min-p 0.1 set. No stop
 * tokens: every sample runs to --new-tokens. Prints one JSON line.
 *
 * With --placement it checks cpuPlacedNodes against the device instead (placement.ts): every
 * training graph opened with CPU fallback off, one JSON line per graph ({ name, predicted, session,
 * agrees }); with --ort-log also the nodes ORT's own log forces to the CPU, for the flagged graphs.
 *   node extract-bench.js --placement [--preset qwen3-0.6b] [--device cuda] [--compute bfloat16] [--ort-log] [--only a,b]
 */
import type { DType } from '@lathe/onnx';
import { MODEL_PRESETS, parseConfig, type HfConfig, type ModelPresetName } from '@lathe/models';
import { arg, flag } from '../argv';
import { measureExtract } from './measure';
import { checkPlacement, forcedCpuNodes, openWithLog } from './placement';

async function main(): Promise<void> {
  const device = arg('device', 'cuda') as 'cuda' | 'cpu';
  if (flag('placement') || flag('placement-case')) {
    const preset = arg('preset', 'qwen3-0.6b') as ModelPresetName;
    if (!MODEL_PRESETS[preset]) throw new Error(`--preset: one of ${Object.keys(MODEL_PRESETS).join(', ')}`);
    const o = { device, config: parseConfig(MODEL_PRESETS[preset].config as HfConfig), compute: arg('compute', device === 'cuda' ? 'bfloat16' : 'float32') as DType };
    if (flag('placement-case')) return openWithLog({ ...o, name: arg('placement-case') });
    const only = flag('only') ? arg('only').split(',') : undefined;
    const ortLog = flag('ort-log') ? (name: string) => forcedCpuNodes([process.argv[1], '--placement-case', name, '--preset', preset, '--device', device, '--compute', o.compute]) : undefined;
    for (const r of checkPlacement({ ...o, only, ortLog })) console.log(JSON.stringify(r));
    return;
  }
  const result = await measureExtract({
    preset: arg('preset', 'qwen3-0.6b') as ModelPresetName,
    device,
    compute: arg('compute', device === 'cuda' ? 'bfloat16' : 'float32') as DType,
    batches: arg('batches', '64,256').split(',').map(Number),
    prompt: Number(arg('prompt', '64')),
    newTokens: Number(arg('new-tokens', '128')),
    minP: Number(arg('min-p', '0.1')),
    maxCandidates: Number(arg('max-candidates', '4')),
    tau: Number(arg('tau', '0.1')),
    trainRows: Number(arg('train-rows', '8')),
    trainLength: Number(arg('train-length', '1024')),
    trainCandidates: Number(arg('train-candidates', '4')),
    steps: Number(arg('steps', '5')),
    seed: Number(arg('seed', '1')),
    kvCache: !flag('no-kv-cache'),
    recompute: !flag('no-recompute'),
  });
  console.log(JSON.stringify(result));
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
