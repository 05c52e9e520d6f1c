/** Learning-rate schedules: the LR of a step, computed on the host (it is one scalar per run). */

/** A schedule's settings. */
export interface ScheduleConfig {
  /** Peak learning rate. */
  lr: number;
  /** 'constant', 'linear' (to 0 at `totalSteps`) or 'cosine' (to `minLrRatio`·lr). */
  kind?: 'constant' | 'linear' | 'cosine';
  /** Linear warm-up steps from 0. Default 0. */
  warmupSteps?: number;
  /** Steps of the whole run (for linear and cosine decay). */
  totalSteps?: number;
  /** Floor of cosine decay as a fraction of lr. Default 0. */
  minLrRatio?: number;
}

/** The learning rate at (0-based) step `step`. */
export function learningRate(cfg: ScheduleConfig, step: number): number {
  const warm = cfg.warmupSteps ?? 0;
  if (step < warm) return (cfg.lr * (step + 1)) / warm;
  const kind = cfg.kind ?? 'constant';
  if (kind === 'constant') return cfg.lr;
  const total = cfg.totalSteps;
  if (!total || total <= warm) throw new Error(`schedule '${kind}' needs totalSteps greater than warmupSteps (${warm})`);
  const progress = Math.min(1, (step - warm) / (total - warm));
  if (kind === 'linear') return cfg.lr * (1 - progress);
  const floor = cfg.minLrRatio ?? 0;
  return cfg.lr * (floor + (1 - floor) * 0.5 * (1 + Math.cos(Math.PI * progress)));
}

/** AdamW bias corrections 1 − βᵗ for (1-based) step t. */
export function biasCorrections(t: number, betas: [number, number] = [0.9, 0.999]): { bc1: number; bc2: number } {
  return { bc1: 1 - betas[0] ** t, bc2: 1 - betas[1] ** t };
}
