/**
 * `lathe launch`: one process per rank of this host, each given torchrun's variables (RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so the command inside forms
 * its group at the rendezvous (@lathe/distributed's `worldFromEnv`). Rank 0's output passes through
 * unchanged (its last line is the command's JSON summary); the other ranks' lines are prefixed with
 * `[rank N] `. When a rank fails, the launcher names it and stops the others: they get --grace_s to
 * exit on their own (naming the lost rank), then SIGTERM, then SIGKILL after another --grace_s.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import type { LaunchConfig } from './launch-config';

/** What a launch ended with. */
export interface LaunchResult {
  /** 0 when every rank exited 0; else the first failed rank's code (128 + signal number when killed). */
  exitCode: number;
  /** The first rank that failed, and how. */
  failed?: { rank: number; code: number | null; signal: NodeJS.Signals | null };
}

/** Where the launcher writes (the ranks' output and its own messages). */
export interface LaunchIO {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
}

/** Each rank's environment: the parent's, with the job's variables. NCCL's NVLink multicast is off unless set. */
export function rankEnv(cfg: LaunchConfig, localRank: number, base: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const rank = cfg.node_rank * cfg.gpus + localRank;
  // the CLI wrapper's pid is the launcher's business: a rank's second Ctrl-C should quit it at once
  const { LATHE_WRAPPER_PID: _wrapper, ...rest } = base;
  return {
    ...rest,
    RANK: String(rank),
    WORLD_SIZE: String(cfg.nnodes * cfg.gpus),
    LOCAL_RANK: String(localRank),
    LOCAL_WORLD_SIZE: String(cfg.gpus),
    GROUP_RANK: String(cfg.node_rank),
    MASTER_ADDR: cfg.master_addr,
    MASTER_PORT: String(cfg.master_port),
    NCCL_NVLS_ENABLE: base.NCCL_NVLS_ENABLE ?? '0',
  };
}

/** Passes a stream's lines on, each prefixed (the last, unterminated piece at the end). */
function lines(prefix: string, write: (t: string) => void) {
  let rest = '';
  return {
    push(chunk: Buffer) {
      if (!prefix) return write(chunk.toString());
      const text = rest + chunk.toString();
      const parts = text.split('\n');
      rest = parts.pop()!;
      for (const p of parts) write(`${prefix}${p}\n`);
    },
    end() {
      if (rest) write(`${prefix}${rest}\n`);
      rest = '';
    },
  };
}

const SIGNAL_CODES: Partial<Record<NodeJS.Signals, number>> = { SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGTERM: 15, SIGABRT: 6, SIGSEGV: 11 };

/**
 * Starts `command` (a program and its arguments) once per local rank and waits for every rank.
 * `signal` (Ctrl-C, SIGTERM to the launcher) is passed on to the ranks as SIGTERM.
 */
export function runLaunch(cfg: LaunchConfig, command: readonly string[], io: LaunchIO, signal?: AbortSignal): Promise<LaunchResult> {
  if (command.length === 0) throw new Error('lathe launch: no command to run: give it after --, e.g. lathe launch --gpus 2 -- sft --config sft.yaml');
  if (cfg.node_rank >= cfg.nnodes) throw new Error(`--node_rank ${cfg.node_rank} is not below --nnodes ${cfg.nnodes}`);
  const first = cfg.node_rank * cfg.gpus;
  return new Promise((resolve) => {
    let failed: LaunchResult['failed'];
    let running = cfg.gpus;
    let killTimer: NodeJS.Timeout | undefined;
    let termTimer: NodeJS.Timeout | undefined;
    const children: ChildProcess[] = [];
    const stopOthers = (why: string) => {
      io.stderr(`lathe launch: ${why}; stopping the other ranks\n`);
      // The others first get --grace_s to notice the lost peer themselves (their next collective
      // fails) and exit with a message naming it; one stuck in a collective gets SIGTERM after.
      termTimer = setTimeout(() => {
        for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
      }, cfg.grace_s * 1000);
      killTimer = setTimeout(() => {
        for (const [i, c] of children.entries()) {
          if (c.exitCode === null && c.signalCode === null) {
            io.stderr(`lathe launch: rank ${first + i} did not exit within ${cfg.grace_s} s of SIGTERM: killing it\n`);
            c.kill('SIGKILL');
          }
        }
      }, 2 * cfg.grace_s * 1000);
    };
    const onAbort = () => {
      for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    for (let i = 0; i < cfg.gpus; i++) {
      const rank = first + i;
      const child = spawn(command[0], command.slice(1), { env: rankEnv(cfg, i), stdio: ['ignore', 'pipe', 'pipe'] });
      children.push(child);
      const prefix = rank === 0 ? '' : `[rank ${rank}] `;
      const out = lines(prefix, io.stdout);
      const err = lines(prefix, io.stderr);
      child.stdout!.on('data', (c: Buffer) => out.push(c));
      child.stderr!.on('data', (c: Buffer) => err.push(c));
      child.on('error', (e) => {
        err.push(Buffer.from(`lathe launch: cannot start ${command[0]} for rank ${rank}: ${e.message}\n`));
      });
      child.on('close', (code, sig) => {
        out.end();
        err.end();
        const ok = code === 0;
        if (!ok && !failed) {
          failed = { rank, code, signal: sig };
          stopOthers(`rank ${rank} ${sig ? `was killed by ${sig}` : `exited with code ${code}`}`);
        }
        if (--running === 0) {
          clearTimeout(termTimer);
          clearTimeout(killTimer);
          signal?.removeEventListener('abort', onAbort);
          const exitCode = failed ? (failed.code ?? 128 + (SIGNAL_CODES[failed.signal!] ?? 0)) : 0;
          resolve({ exitCode, ...(failed ? { failed } : {}) });
        }
      });
    }
  });
}
