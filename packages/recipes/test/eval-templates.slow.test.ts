/**
 * `lathe eval`'s prompt templates and thinking modes, end to end through runEval with a stand-in
 * engine (no weights read or compiled) that answers the rendered prompts: what the model reads
 * under each template, and how its answer is found (after </think>; inside <think> for r1-zero).
 */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { HfTokenizer } from '@lathe/tokenizer';
import { defaults, evalSchema, runEval, type EvalConfig, type TrajectoryEngineRunner } from '@lathe/recipes';
import { tinyQwen3 } from './tiny-qwen3';

const root = mkdtempSync(join(tmpdir(), 'lathe-eval-templates-'));
const model = tinyQwen3(join(root, 'tiny'), { seed: 2, maxPositions: 1024 });
const config = (over: Partial<EvalConfig>): EvalConfig => ({ ...defaults(evalSchema), model, max_new_tokens: 32, grade_workers: 1, ...over });

/**
 * An engine that reads each rendered prompt ("What is a + b?" / "a * b") and answers it in `form`,
 * so the templates' plumbing is checked without weights: it also records the rendered prompts.
 */
async function answeringEngine(form: (answer: number) => string): Promise<{ engine: TrajectoryEngineRunner; rendered: string[] }> {
  const tok = await HfTokenizer.fromFolder(model);
  const rendered: string[] = [];
  const engine: TrajectoryEngineRunner = {
    generate: async (prompts, call) =>
      prompts.flatMap((ids, promptIndex) => {
        const text = tok.decode(ids, { skipSpecialTokens: false });
        rendered.push(text);
        const m = /What is (\d+) ([+*]) (\d+)\?/.exec(text)!;
        const answer = m[2] === '+' ? Number(m[1]) + Number(m[3]) : Number(m[1]) * Number(m[3]);
        return (call.sampleKeys?.[promptIndex] ?? [0]).map((_, sampleIndex) => ({ promptIndex, sampleIndex, tokens: tok.encode(form(answer)), logprobs: [], rawLogprobs: [], finishReason: 'stop' as const }));
      }),
  };
  return { engine, rendered };
}

describe('prompt templates and thinking modes reach the model as configured', () => {
  const data = join(root, 'arith');
  mkdirSync(join(data, 'gsm8k'), { recursive: true });
  writeFileSync(join(data, 'gsm8k/test.jsonl'), ['{"question": "What is 2 + 3?", "answer": "#### 5"}', '{"question": "What is 4 * 6?", "answer": "#### 24"}'].join('\n') + '\n');
  const arith = (over: Partial<EvalConfig>) => config({ benchmarks: 'gsm8k', data_dir: data, n_large: 2, run_dir: join(root, `t-${Object.values(over).join('-')}`), ...over });
  const avg = (r: Awaited<ReturnType<typeof runEval>>) => r.models[0].metrics.gsm8k.avgAtN;

  test('qwen-boxed with thinking on: the chat template, the boxed instruction, the answer after </think>', async () => {
    const { engine, rendered } = await answeringEngine((a) => `<think>\nadding up\n</think>\n\nSo \\boxed{${a}}`);
    expect(avg(await runEval(arith({}), {}, undefined, { standInEngine: engine }))).toBe(1);
    expect(rendered[0]).toMatch(/^<\|im_start\|>user\nWhat is 2 \+ 3\?\nPlease reason step by step, and put your final answer within \\boxed\{\}\.<\|im_end\|>\n<\|im_start\|>assistant\n$/);
  });

  test('thinking off: the empty think block in the prompt', async () => {
    const { engine, rendered } = await answeringEngine((a) => `\\boxed{${a}}`);
    expect(avg(await runEval(arith({ thinking: false }), {}, undefined, { standInEngine: engine }))).toBe(1);
    expect(rendered[0]).toMatch(/<\|im_start\|>assistant\n<think>\n\n<\/think>\n\n$/);
  });

  test('r1-zero: the response starts inside <think>, so a box before </think> is no answer', async () => {
    const closed = await answeringEngine((a) => `adding </think> <answer>${a}</answer>`);
    expect(avg(await runEval(arith({ prompt_template: 'r1-zero' }), {}, undefined, { standInEngine: closed.engine }))).toBe(1);
    expect(closed.rendered[0]).toMatch(/^A conversation between User and Assistant\..*\nUser: What is 2 \+ 3\?\nAssistant: <think>$/s);
    const unclosed = await answeringEngine((a) => `it is \\boxed{${a}}`);
    const r = await runEval(arith({ prompt_template: 'r1-zero', run_dir: join(root, 't-r1-unclosed') }), {}, undefined, { standInEngine: unclosed.engine });
    expect(r.models[0].metrics.gsm8k).toMatchObject({ avgAtN: 0, noAnswerRate: 1 });
  });

  test('your own template as the whole input (--raw_template)', async () => {
    const { engine, rendered } = await answeringEngine((a) => ` ${a}`);
    expect(avg(await runEval(arith({ prompt_template: 'Q: {problem}\nA:', raw_template: true }), {}, undefined, { standInEngine: engine }))).toBe(1);
    expect(rendered[0]).toBe('Q: What is 2 + 3?\nA:');
  });
});
