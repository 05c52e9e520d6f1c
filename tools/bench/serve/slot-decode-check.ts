/**
 * serve-bench's `--check-decode`: the slot engine under `lathe serve`'s decode options against the
 * batch KV-cache engine under the same options (greedy, ragged prompts, more prompts than slots so
 * that slots are reused), and both engines' default paths against each other as the baseline: in
 * bf16 the two engines' prefills run other batch shapes, so the baseline shows how often that alone
 * changes a token, and the options' pair should agree as often.
 */
import type { DType } from '@lathe/onnx';
import { CausalLM } from '@lathe/models';
import { KvCacheGenerator, SlotEngine, type SlotToken } from '@lathe/rollout';
import { decodeEngineOptions, kernelsOfDevice, openDevice, type DecodeEngineOptions, type ResolvedDecodeOptions } from '@lathe/recipes';

/**
 * Each prompt's greedy tokens through `engine`, one admission per step while a slot is free (so with
 * more prompts than slots, later prompts reuse freed slots); `maxNew` tokens each (or the prompt's own
 * count), after which its slot is released.
 */
export function slotGreedy(engine: SlotEngine, prompts: readonly number[][], maxNew: number | readonly number[]): SlotToken[][] {
  const out = prompts.map(() => [] as SlotToken[]);
  const limit = (i: number) => (typeof maxNew === 'number' ? maxNew : maxNew[i]);
  const owner = new Map<number, number>();
  const take = (ts: readonly SlotToken[]) => {
    for (const t of ts) {
      const i = owner.get(t.slot)!;
      out[i].push(t);
      if (out[i].length === limit(i)) {
        engine.release(t.slot);
        owner.delete(t.slot);
      }
    }
  };
  for (let next = 0; next < prompts.length || owner.size; ) {
    if (next < prompts.length && engine.free > 0) {
      const [a] = engine.admit([{ prompt: prompts[next], rows: [{ sampling: { temperature: 0 }, seed: 0, key: 0 }] }]);
      owner.set(a.slots[0], next++);
      take(a.tokens);
    }
    take(engine.step());
  }
  return out;
}

/** How two runs' greedy tokens agree: whole sequences equal, the mean shared prefix, and the first token's largest log-prob gap. */
function agreement(a: { tokens: number[]; logprobs: number[] }[], b: { tokens: number[]; logprobs: number[] }[]) {
  let equal = 0;
  let prefix = 0;
  let firstGap = 0;
  a.forEach((x, i) => {
    const y = b[i];
    let n = 0;
    while (n < x.tokens.length && x.tokens[n] === y.tokens[n]) n++;
    if (n === x.tokens.length && n === y.tokens.length) equal++;
    prefix += n / x.tokens.length;
    firstGap = Math.max(firstGap, Math.abs(x.logprobs[0] - y.logprobs[0]));
  });
  return { sequences_equal: `${equal}/${a.length}`, mean_prefix: +(prefix / a.length).toFixed(3), first_logprob_gap: +firstGap.toFixed(4) };
}

/** Runs the check on `model` (a folder) and returns one JSON-able record. */
export async function checkSlotDecode(o: { model: string; device: 'cuda' | 'cpu'; dtype: DType; decode: ResolvedDecodeOptions; prompts: number[][]; maxNew: number; slots: number }): Promise<Record<string, unknown>> {
  const lm = CausalLM.fromPretrainedSync(o.model, { device: openDevice(o.device), dtype: o.dtype });
  const ops = decodeEngineOptions(o.decode, o.device === 'cuda' ? kernelsOfDevice(0) : undefined, lm.config);
  const maxLength = Math.max(...o.prompts.map((p) => p.length)) + o.maxNew;
  const runSlots = (extra: DecodeEngineOptions['options']) => {
    const engine = SlotEngine.create(lm, { slots: o.slots, maxLength, ...extra });
    try {
      return slotGreedy(engine, o.prompts, o.maxNew).map((ts) => ({ tokens: ts.map((t) => t.token), logprobs: ts.map((t) => t.rawLogprob) }));
    } finally {
      engine.dispose();
    }
  };
  const runBatch = async (extra: DecodeEngineOptions['options']) => {
    const gen = KvCacheGenerator.create(lm, { temperature: 0, rows: o.slots, maxLength, ...extra });
    try {
      return (await gen.generate(o.prompts, { maxNewTokens: o.maxNew, stopIds: [] })).map((c) => ({ tokens: c.tokens, logprobs: c.rawLogprobs }));
    } finally {
      gen.dispose();
    }
  };
  try {
    const slot = runSlots(ops.options);
    const batch = await runBatch(ops.options);
    const slotDefault = runSlots({});
    const batchDefault = await runBatch({});
    return {
      bench: 'slot-decode-check',
      prompts: o.prompts.length,
      slots: o.slots,
      max_new: o.maxNew,
      slot_vs_batch_same_options: agreement(slot, batch),
      baseline_slot_vs_batch_defaults: agreement(slotDefault, batchDefault),
      slot_options_vs_slot_default: agreement(slot, slotDefault),
    };
  } finally {
    ops.dispose();
    lm.dispose();
  }
}
