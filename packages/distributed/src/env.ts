/**
 * Where this process sits in a job: its rank, the world size, its GPU on the host, and the
 * rendezvous address. Read from torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
 * `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), which `lathe launch` sets, or else from Slurm's
 * (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE`), so a job started by
 * `srun`, torchrun or any launcher that sets either family runs unchanged.
 */

/** A process's place in a job. */
export interface WorldInfo {
  /** This process's rank, 0 … worldSize − 1. */
  rank: number;
  /** Processes in the job. */
  worldSize: number;
  /** Rank on this host: the GPU it uses. */
  localRank: number;
  /** Processes on this host. */
  localWorldSize: number;
  /** Host of rank 0, where the rendezvous listens. */
  masterAddr: string;
  /** Port of the rendezvous. */
  masterPort: number;
  /** Which variables it came from ('single' when none are set: one process). */
  source: 'torchrun' | 'slurm' | 'single';
}

/** The rendezvous port when MASTER_PORT is not set (torchrun's default). */
export const DEFAULT_MASTER_PORT = 29500;

function intVar(env: NodeJS.ProcessEnv, name: string, min: number): number | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  // Slurm writes SLURM_NTASKS_PER_NODE as e.g. "4(x2)" for a uniform job: the count is the number before the parenthesis.
  const text = name === 'SLURM_NTASKS_PER_NODE' ? raw.split('(')[0].split(',')[0] : raw;
  const n = Number(text);
  if (!Number.isInteger(n) || n < min) throw new Error(`${name}=${raw}: expected an integer ≥ ${min}`);
  return n;
}

/**
 * Reads the job layout from `env` (default `process.env`). With neither RANK/WORLD_SIZE nor
 * SLURM_PROCID/SLURM_NTASKS set, the process is alone (rank 0 of 1). Inconsistent values are an
 * error naming the variables.
 */
export function worldFromEnv(env: NodeJS.ProcessEnv = process.env): WorldInfo {
  const torch = env.RANK !== undefined || env.WORLD_SIZE !== undefined;
  const slurm = !torch && env.SLURM_PROCID !== undefined && env.SLURM_NTASKS !== undefined;
  const masterAddr = env.MASTER_ADDR || '127.0.0.1';
  const masterPort = intVar(env, 'MASTER_PORT', 1) ?? DEFAULT_MASTER_PORT;
  if (masterPort > 65535) throw new Error(`MASTER_PORT=${masterPort}: a TCP port is at most 65535`);
  if (!torch && !slurm) return { rank: 0, worldSize: 1, localRank: 0, localWorldSize: 1, masterAddr, masterPort, source: 'single' };
  const [rankVar, worldVar, localVar, localWorldVar] = torch
    ? ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE']
    : ['SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID', 'SLURM_NTASKS_PER_NODE'];
  const rank = intVar(env, rankVar, 0);
  const worldSize = intVar(env, worldVar, 1);
  if (rank === undefined || worldSize === undefined) throw new Error(`${rankVar} and ${worldVar} must be set together (got ${rankVar}=${env[rankVar] ?? 'unset'}, ${worldVar}=${env[worldVar] ?? 'unset'})`);
  if (rank >= worldSize) throw new Error(`${rankVar}=${rank} is not below ${worldVar}=${worldSize}`);
  const localRank = intVar(env, localVar, 0) ?? rank;
  const localWorldSize = intVar(env, localWorldVar, 1) ?? worldSize;
  if (localRank >= localWorldSize) throw new Error(`${localVar}=${localRank} is not below ${localWorldVar}=${localWorldSize}`);
  if (slurm && worldSize > 1 && !env.MASTER_ADDR) {
    throw new Error('SLURM_NTASKS > 1 and MASTER_ADDR is unset: export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) in the batch script (docs/guides/multi-node.md)');
  }
  return { rank, worldSize, localRank, localWorldSize, masterAddr, masterPort, source: torch ? 'torchrun' : 'slurm' };
}
