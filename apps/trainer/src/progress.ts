/** Progress display for training commands: a bar on stderr when it is a terminal, log lines otherwise. */
import { SingleBar, Presets } from 'cli-progress';
import type { SftConfig, SftEvents } from '@lathe/recipes';

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
    onCheckpoint: (dir) => log(`checkpoint ${dir}`),
  };
  return {
    events,
    stop: () => {
      if (running) bar.stop();
      running = false;
    },
  };
}
