/** Progress display for training commands: a bar on stderr when it is a terminal, log lines otherwise. */
import { SingleBar, Presets } from 'cli-progress';
import type { SftConfig, SftEvents, TrainBenchmarkResult } from '@lathe/recipes';
import type { Reporter } from './interrupt';

/** Events that drive a progress bar (or plain lines) for an SFT run. */
export function sftReporter(cfg: SftConfig): { events: SftEvents; stop(): void } {
  const tty = Boolean(process.stderr.isTTY);
  const bar = new SingleBar(
    { format: 'sft |{bar}| {value}/{total} steps | loss {loss} | {tps} tok/s | eval {acc}', stream: process.stderr, hideCursor: true },
    Presets.shades_classic,
  );
  let running = false;
  let acc = '-';
  const log = (s: string) => (tty && running ? bar.update({ acc }) : process.stderr.write(s + '\n'));
  const events: SftEvents = {
    onStart: (i) => {
      process.stderr.write(
        `sft: ${i.parameters.toLocaleString('en-US')} parameters, ${i.trainExamples} training examples (${i.dropped} over ${cfg.max_length} tokens skipped, ${i.truncated} truncated)${i.packed ? ` packed into ${i.packed.rows} rows of ${cfg.max_length} tokens (${(100 * i.packed.fill).toFixed(1)}% filled)` : ''}, ${i.evalExamples} held out; steps ${i.startStep} → ${i.totalSteps} on ${cfg.device}\n`,
      );
      if (tty) {
        bar.start(i.totalSteps, i.startStep, { loss: '-', tps: '-', acc });
        running = true;
      }
    },
    onStep: (m) => {
      if (tty) bar.update(m.step, { loss: m.loss.toFixed(3), tps: Math.round(m.tokens_per_s), acc });
      else if (m.step % cfg.log_every === 0) process.stderr.write(`step ${m.step}/${cfg.steps} loss ${m.loss.toFixed(4)} grad_norm ${m.grad_norm.toFixed(3)} lr ${m.lr.toExponential(2)} ${Math.round(m.tokens_per_s)} tok/s\n`);
    },
    onEval: (r) => {
      acc = `${(100 * r.accuracy).toFixed(1)}%`;
      log(`eval at step ${r.step}: exact match ${acc} of ${r.examples}`);
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

/** One line for a benchmark evaluation during training (`--eval_benchmarks`): avg@n per benchmark, samples and time. */
export function benchmarkLine(r: TrainBenchmarkResult): string {
  const cells = Object.entries(r.metrics).map(([b, m]) => `${b} avg@${m.n} ${(100 * m.avgAtN).toFixed(1)}%`);
  return `benchmarks at step ${r.step}: ${cells.join(', ')} (${r.samples} samples, ${r.seconds.toFixed(1)} s)`;
}

/** What a preference run's progress reads of a step, an evaluation and the start (rm train, dpo). */
interface PairStepLine {
  step: number;
  loss: number;
  accuracy: number;
  margin: number;
  grad_norm: number;
  lr: number;
}
interface PairEvalLine {
  step: number;
  pairs: number;
  accuracy: number;
  margin: number;
}
interface PairStartLine {
  parameters: number;
  trainable: number;
  trainPairs: number;
  evalPairs: number;
  skipped: { overLength: number; identical: number };
  startStep: number;
  totalSteps: number;
}

/**
 * Progress for a preference training run (`lathe rm train`, `lathe dpo`): `name` heads its lines and
 * bar, `startNote` adds to the start line, `accuracyLabel` names the held-out accuracy.
 */
export function pairReporter<I extends PairStartLine>(
  name: string,
  cfg: { max_length: number; device: string; log_every: number; steps: number },
  o: { startNote?: (i: I) => string; accuracyLabel: string },
): Reporter<{ onStart(i: I): void; onStep(m: PairStepLine): void; onEval(r: PairEvalLine): void; onCheckpoint(dir: string): void }> {
  const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
  const tty = Boolean(process.stderr.isTTY);
  const bar = new SingleBar({ format: `${name} |{bar}| {value}/{total} steps | loss {loss} | acc {acc} | held-out {eval}`, stream: process.stderr, hideCursor: true }, Presets.shades_classic);
  let running = false;
  let held = '-';
  const log = (s: string) => (tty && running ? bar.update({ eval: held }) : process.stderr.write(s + '\n'));
  return {
    events: {
      onStart: (i) => {
        process.stderr.write(
          `${name}: ${i.parameters.toLocaleString('en-US')} parameters (${i.trainable.toLocaleString('en-US')} trained), ${i.trainPairs} training pairs, ${i.evalPairs} held out ` +
            `(${i.skipped.overLength} over ${cfg.max_length} tokens and ${i.skipped.identical} with identical responses skipped); ${o.startNote ? `${o.startNote(i)}; ` : ''}steps ${i.startStep} → ${i.totalSteps} on ${cfg.device}\n`,
        );
        if (tty) {
          bar.start(i.totalSteps, i.startStep, { loss: '-', acc: '-', eval: held });
          running = true;
        }
      },
      onStep: (m) => {
        if (tty) bar.update(m.step, { loss: m.loss.toFixed(3), acc: pct(m.accuracy), eval: held });
        else if (m.step % cfg.log_every === 0) process.stderr.write(`step ${m.step}/${cfg.steps} loss ${m.loss.toFixed(4)} accuracy ${pct(m.accuracy)} margin ${m.margin.toFixed(3)} grad_norm ${m.grad_norm.toFixed(3)} lr ${m.lr.toExponential(2)}\n`);
      },
      onEval: (r) => {
        held = pct(r.accuracy);
        log(`held-out at step ${r.step}: ${o.accuracyLabel} ${held} of ${r.pairs} pairs, margin ${r.margin.toFixed(3)}`);
      },
      onCheckpoint: (dir) => log(`checkpoint ${dir}`),
    },
    stop: () => {
      if (running) bar.stop();
      running = false;
    },
  };
}
