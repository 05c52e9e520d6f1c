import type { CommandModule } from 'yargs';
import { SingleBar, Presets } from 'cli-progress';
import { listEvals } from '@lathe/data';
import { grpoPresetSource, grpoSchema, runGrpo, type GrpoConfig, type GrpoEvents, type GrpoRunResult } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { finishRun, runReported, type Interruptible } from '../interrupt';
import { benchmarkLine } from '../progress';

/** Each reward source's mean, as ' (rm 1.234, correct 0.500)', when a run has more than one source. */
function bySource(m: Parameters<NonNullable<GrpoEvents['onStep']>>[0]): string {
  const means = Object.entries(m).flatMap(([k, v]) => (k.startsWith('reward/') && k.endsWith('/mean') ? [`${k.slice('reward/'.length, -'/mean'.length)} ${v.toFixed(3)}`] : []));
  return means.length > 1 ? ` (${means.join(', ')})` : '';
}

/** With off-policy traces the samples' own reward, with a value model its loss and explained variance: ' (samples 0.125) value 0.0123 ev 0.41'. */
function splitAndCritic(m: Parameters<NonNullable<GrpoEvents['onStep']>>[0]): string {
  const samples = m['on_policy/reward_mean'];
  const loss = m['value/loss'];
  const ev = m['value/explained_variance'];
  return (samples !== undefined ? ` (samples ${samples.toFixed(3)})` : '') + (loss !== undefined ? ` value ${loss.toFixed(4)} ev ${Number.isFinite(ev) ? ev.toFixed(2) : '-'}${m['value/policy_frozen'] ? ' (policy frozen)' : ''}` : '');
}

/** A step's group in words: '8 samples', '7 samples + 1 off-policy trace', with PPO's critic named. */
function groupWords(cfg: GrpoConfig): string {
  const n = cfg.off_policy_traces;
  const group = n > 0 ? `${cfg.group_size - n} samples + ${n} off-policy trace${n > 1 ? 's' : ''}` : `${cfg.group_size} samples`;
  return cfg.estimator === 'gae' ? `${group}, PPO with a ${cfg.value_trunk === 'shared' ? 'value head on the policy’s trunk' : 'value model of its own'}` : group;
}

/** Progress for a GRPO run: a bar on stderr when it is a terminal, log lines otherwise. */
export function grpoReporter(cfg: GrpoConfig, label = 'grpo'): { events: GrpoEvents; stop(): void } {
  const tty = Boolean(process.stderr.isTTY);
  const bar = new SingleBar({ format: `${label} |{bar}| {value}/{total} steps | reward {reward} | kl {kl} | {sps} s/step | eval {acc}`, stream: process.stderr, hideCursor: true }, Presets.shades_classic);
  let running = false;
  let acc = '-';
  const log = (s: string) => (tty && running ? bar.update({ acc }) : process.stderr.write(s + '\n'));
  const events: GrpoEvents = {
    onStart: (i) => {
      process.stderr.write(
        `${label}: ${i.parameters.toLocaleString('en-US')} parameters (${i.trainable.toLocaleString('en-US')} trained), ${i.trainPrompts} training prompts, ${i.evalPrompts} held out; ` +
          `${cfg.prompts_per_step} prompts × ${groupWords(cfg)} per step; steps ${i.startStep} → ${i.totalSteps} on ${cfg.device}\n`,
      );
      if (tty) {
        bar.start(i.totalSteps, i.startStep, { reward: '-', kl: '-', sps: '-', acc });
        running = true;
      }
    },
    onStep: (m) => {
      const kl = Number.isNaN(m.kl_ref) ? '-' : m.kl_ref.toExponential(1);
      if (tty) bar.update(m.step, { reward: m.reward_mean.toFixed(3), kl, sps: (m.step_ms / 1000).toFixed(2), acc });
      else if (m.step % cfg.log_every === 0) {
        process.stderr.write(
          `step ${m.step}/${cfg.steps} reward ${m.reward_mean.toFixed(3)}±${m.reward_std.toFixed(3)}${bySource(m)}${splitAndCritic(m)} kl ${kl} clip ${m.clip_fraction.toFixed(3)} len ${m.response_length_mean.toFixed(1)} parity ${m.logp_parity.toFixed(5)} ` +
            // dynamic sampling ran out of rounds: the step trained on fewer groups than --prompts_per_step
            (m.dynamic_sampling_shortfall > 0 ? `short ${m.dynamic_sampling_shortfall} groups ` : '') +
            `${(m.step_ms / 1000).toFixed(2)} s (gen ${(m.generation_ms / 1000).toFixed(2)}, score ${(m.scoring_ms / 1000).toFixed(2)}, train ${(m.training_ms / 1000).toFixed(2)}, rewards ${(m.rewards_ms / 1000).toFixed(2)}, host ${(m.host_ms / 1000).toFixed(2)})\n`,
        );
      }
    },
    onEval: (r) => {
      acc = r.reward_mean !== undefined ? `reward ${r.reward_mean.toFixed(3)}` : `${(100 * r.accuracy).toFixed(1)}%`;
      log(`${label} eval at step ${r.step}: ${r.reward_mean !== undefined ? acc : `accuracy ${acc}`} of ${r.examples}${r.grader_failures ? ` (${r.grader_failures} grader failures, scored incorrect)` : ""}`);
    },
    onBenchmarks: (r) => log(benchmarkLine(r)),
    onCheckpoint: (dir) => log(`checkpoint ${dir}`),
    onServe: (url) => log(`serving the policy being trained at ${url} (OpenAI API; system_fingerprint names the step)`),
  };
  return {
    events,
    stop: () => {
      if (running) bar.stop();
      running = false;
    },
  };
}

/**
 * Runs GRPO with a progress display and Ctrl-C/SIGTERM handling: the first stops after the current
 * step with a checkpoint (`stoppedBy` names the signal), a second quits at once.
 */
export async function grpoRunInterruptible(cfg: GrpoConfig, label?: string): Promise<Interruptible<GrpoRunResult>> {
  return runReported(grpoReporter(cfg, label), (events, signal) => runGrpo(cfg, events, signal));
}

/** Runs GRPO and prints a one-line JSON summary; an interrupted run exits 130 (SIGINT) or 143 (SIGTERM). */
export async function grpoMain(cfg: GrpoConfig): Promise<void> {
  const run = await grpoRunInterruptible(cfg);
  const result = run.value;
  const first = result.evals[0];
  const last = result.evals.at(-1);
  finishRun(run, {
    run_dir: cfg.run_dir,
    steps: result.steps,
    reward_mean: result.last?.reward_mean,
    // a resumed run evaluated step 0 before its checkpoint: read back from eval/
    acc_before_grpo: first?.step === 0 ? first.accuracy : listEvals(cfg.run_dir).find((e) => e.step === 0)?.accuracy ?? undefined,
    acc_after_grpo: last?.accuracy,
    // --reward none: no answers; the held-out greedy completions' mean reward instead
    ...(last?.reward_mean !== undefined ? { eval_reward_before: first?.step === 0 ? first.reward_mean : undefined, eval_reward_after: last.reward_mean } : {}),
    eval_examples: last?.examples,
    checkpoint: result.checkpoint,
    interrupted: result.interrupted,
    ...(result.offPolicy ? { on_policy_reward_mean: result.last?.['on_policy/reward_mean'], off_policy: result.offPolicy } : {}),
  });
}

/**
 * The config of a `lathe grpo` call: defaults ← `--preset` (given as a flag or in the config file)
 * ← the config file ← flags, so a preset's values can still be changed one by one.
 */
export function grpoConfigFromArgv(argv: Record<string, unknown>): GrpoConfig {
  const first = configFromArgv(grpoSchema, argv);
  const preset = grpoPresetSource(first.preset);
  return preset ? configFromArgv(grpoSchema, argv, preset) : first;
}

/** `lathe grpo`: GRPO-family RL (GRPO, Dr.GRPO, RLOO, ReMax, REINFORCE++; DAPO options). */
export const grpoCommand: CommandModule = {
  command: 'grpo',
  describe: 'GRPO-family RL: G samples per prompt, rewards, group advantages, PPO-clipped updates with a KL to the frozen start model; rollouts to SQLite',
  builder: (y) =>
    addSchemaFlags(y, grpoSchema)
      .example('$0 grpo --model runs/demo/checkpoints/step-00001000 --tokenizer builtin:addition --lr 2e-4 --max_new_tokens 6', 'RL on the built-in addition task after `lathe demo`’s SFT stage')
      .example('$0 grpo --config grpo.yaml --resume', 'continue a run (the config must match the checkpoint’s; --force accepts changes)')
      .example('$0 grpo --preset luffy --data traces.jsonl --off_policy_field solution --model Qwen3-0.6B', 'LUFFY: 7 samples + 1 off-policy trace per group (docs/guides/luffy.md)'),
  handler: async (argv) => grpoMain(grpoConfigFromArgv(argv)),
};
