/**
 * A reward model from a Hugging Face causal LM, saved as a sequence-classification checkpoint,
 * loaded back and scored: the Lathe side of tools/reference/reward-models/rm_parity.py, which loads
 * the same folder with transformers' AutoModelForSequenceClassification and compares the scores.
 *
 * usage: node rm-parity.js --model LM_DIR --out RM_DIR --batch batch.json [--device cuda|cpu] [--dtype float32|bfloat16] [--pad 0]
 * batch.json: {"input_ids": [[...]], "attention_mask": [[...]]} (rows right- or left-padded)
 * Prints one JSON line: {"scores": [...]} (one per row, read at its last real token).
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import type { DType } from '@lathe/onnx';
import { CausalLM } from '@lathe/models';
import { RewardModel } from '@lathe/reward-models';
import { arg } from '../argv';

async function main(): Promise<void> {
  const batch = JSON.parse(readFileSync(arg('batch'), 'utf8')) as Record<'input_ids' | 'attention_mask', number[][]>;
  const rm = RewardModel.fromCausalLM(await CausalLM.fromPretrained(resolve(arg('model'))), { padTokenId: Number(arg('pad', '0')), seed: 1 });
  const out = resolve(arg('out'));
  rm.save(out);
  rm.dispose();
  const back = await RewardModel.fromPretrained(out, { device: arg('device', 'cuda') as 'cuda' | 'cpu', dtype: arg('dtype', 'float32') as DType });
  const [B, T] = [batch.input_ids.length, batch.input_ids[0].length];
  const i64 = (rows: number[][]) => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [B, T] });
  const scores = await back.score({ inputIds: i64(batch.input_ids), attentionMask: i64(batch.attention_mask) });
  console.log(JSON.stringify({ scores: Array.from(scores) }));
  back.dispose();
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : e);
  process.exit(1);
});
