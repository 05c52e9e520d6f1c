import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as protobuf from 'protobufjs';
import { readMetrics } from '@lathe/data';
import { defaults, reportTargets, runSft, sftSchema, type SftConfig } from '@lathe/recipes';

/** Each event's step and scalars in a TensorBoard event file (TFRecord framing; Event field 2 step, 5 summary → Value 1 tag, 2 simple_value). */
function tensorBoardScalars(file: string): { step: number; values: Record<string, number> }[] {
  const b = readFileSync(file);
  const out: { step: number; values: Record<string, number> }[] = [];
  for (let at = 0; at < b.length; ) {
    const n = Number(b.readBigUInt64LE(at));
    const r = protobuf.Reader.create(b.subarray(at + 12, at + 12 + n));
    const e = { step: -1, values: {} as Record<string, number> };
    while (r.pos < r.len) {
      const tag = r.uint32();
      if (tag >>> 3 === 2) e.step = Number(r.int64());
      else if (tag >>> 3 === 5) {
        const s = protobuf.Reader.create(r.bytes());
        while (s.pos < s.len) {
          s.uint32();
          const v = protobuf.Reader.create(s.bytes());
          v.uint32();
          const name = v.string();
          v.uint32();
          e.values[name] = v.float();
        }
      } else r.skipType(tag & 7);
    }
    if (e.step >= 0) out.push(e);
    at += 16 + n;
  }
  return out;
}

const config = (over: Partial<SftConfig>): SftConfig => ({ ...defaults(sftSchema), run_dir: mkdtempSync(join(tmpdir(), 'lathe-report-')), steps: 6, batch_size: 8, eval_examples: 4, eval_every: 3, save_every: 0, log_every: 2, warmup_steps: 1, lr: 3e-3, ...over });

test('--report_to takes tensorboard, wandb, both or none, and names what it does not know', () => {
  expect(reportTargets('none')).toEqual([]);
  expect(reportTargets('tensorboard, wandb')).toEqual(['tensorboard', 'wandb']);
  expect(() => reportTargets('tensorbord')).toThrow("--report_to tensorbord: unknown target 'tensorbord' (known: none, tensorboard, wandb)");
  expect(() => reportTargets('none,wandb')).toThrow("'none' cannot be combined");
});

test('an SFT run reports every metrics.jsonl line to TensorBoard at its step, one event file per process (a resume adds one)', async () => {
  const cfg = config({ report_to: 'tensorboard' });
  const controller = new AbortController();
  await runSft(cfg, { onStep: (m) => m.step === 4 && controller.abort() }, controller.signal);
  await runSft({ ...cfg, resume: true });
  const metrics = readMetrics(join(cfg.run_dir, 'metrics.jsonl'));
  const files = readdirSync(join(cfg.run_dir, 'tensorboard')).sort();
  expect(files).toHaveLength(2);
  const events = files.flatMap((f) => tensorBoardScalars(join(cfg.run_dir, 'tensorboard', f)));
  expect(events.map((e) => e.step)).toEqual(metrics.map((m) => m.step));
  events.forEach((e, i) => expect(e.values).toEqual(Object.fromEntries(Object.entries(metrics[i]).filter(([k, v]) => k !== 'step' && typeof v === 'number' && Number.isFinite(v)).map(([k, v]) => [k, Math.fround(v as number)]))));
}, 120_000);

test('--report_to wandb without an API key is an error before the run starts', async () => {
  const env = { ...process.env };
  delete process.env.WANDB_API_KEY;
  delete process.env.WANDB_MODE;
  try {
    const cfg = config({ report_to: 'wandb' });
    await expect(runSft(cfg)).rejects.toThrow('--report_to wandb: set WANDB_API_KEY');
    expect(readdirSync(cfg.run_dir)).toEqual([]);
  } finally {
    process.env = env;
  }
});
