/**
 * Start-up cost of one sandboxed run (bubblewrap + rlimits + interpreter) for Python and JavaScript,
 * sequential and with 4 runs at once. Usage: npx tsx --conditions=lathe-source tools/bench/graders/sandbox-overhead.ts
 */
import { runSandboxed, type SandboxLanguage } from '@lathe/graders';

const PROGRAMS: Record<SandboxLanguage, string> = { python: 'print(sum(range(10)))', javascript: 'console.log(45)' };

async function main(): Promise<void> {
  for (const language of ['python', 'javascript'] as const) {
    const n = 40;
    let t0 = performance.now();
    for (let i = 0; i < n; i++) {
      const r = await runSandboxed({ language, source: PROGRAMS[language] });
      if (r.stdout.trim() !== '45') throw new Error(`${language}: unexpected output ${JSON.stringify(r)}`);
    }
    const sequential = (performance.now() - t0) / n;
    t0 = performance.now();
    for (let i = 0; i < n; i += 4) await Promise.all([0, 1, 2, 3].map(() => runSandboxed({ language, source: PROGRAMS[language] })));
    const parallel = (performance.now() - t0) / n;
    console.log(`${language}: ${sequential.toFixed(1)} ms per run sequential, ${parallel.toFixed(1)} ms per run with 4 at once`);
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
