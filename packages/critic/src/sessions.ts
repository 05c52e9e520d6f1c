/**
 * A reference policy and a critic compiled on one device with their weights uploaded once: the
 * reference's graph is the caller's (all positions' candidates for labelling, the last token's for
 * sampling), the critic's is the tree pass that scores every candidate of a row at once.
 */
import * as L from '@lathe/onnx';
import type { DType } from '@lathe/onnx';
import { paramSpecs, weightInputs, type DecoderConfig } from '@lathe/models';
import type { Device, DeviceTensor, HostTensor, Session } from '@lathe/runtime';
import type { CriticBins } from './bins';
import { criticTreeProbs } from './loss';
import { padTreeBatch, treeEstimates, type TreeEstimates, type TreeRow } from './label';

/** A model's config and float32 weights. */
export interface ModelWeights {
  config: DecoderConfig;
  weights: Map<string, Float32Array>;
}

/** The critic's tree-pass graph: input_ids, position_ids, is_candidate int64 [B, N] and the weights → cell_probs [B, N, cells]. */
export function criticTreeGraph(config: DecoderConfig, bins: CriticBins, compute: DType, name = 'critic_tree'): L.Graph {
  const g = new L.Graph(name);
  g.output(criticTreeProbs(g, config, bins, weightInputs(g, config, 'float32', compute).weights), 'cell_probs');
  return g;
}

/** The reference's and the critic's sessions and uploaded weights (see the module comment). */
export class ReferenceCriticSessions {
  private constructor(
    private readonly bins: CriticBins,
    private readonly padId: number,
    private readonly refSession: Session,
    private readonly criticSession: Session,
    /** The reference's weights on the device, by HF name. */
    readonly referenceWeights: Record<string, DeviceTensor>,
    /** The critic's weights on the device, by HF name. */
    readonly criticWeights: Record<string, DeviceTensor>,
  ) {}

  /** Compiles `referenceGraph` and the critic's tree pass (`criticName` names its graph) on `device` and uploads both models' weights. */
  static open(opts: { device: Device; reference: ModelWeights; critic: ModelWeights; referenceGraph: L.Graph; criticName?: string; bins: CriticBins; compute: DType; padId: number }): ReferenceCriticSessions {
    const upload = (m: ModelWeights) => Object.fromEntries(paramSpecs(m.config).map((s) => [s.name, opts.device.upload({ data: m.weights.get(s.name)!, dims: s.shape })]));
    const critic = criticTreeGraph(opts.critic.config, opts.bins, opts.compute, opts.criticName);
    return new ReferenceCriticSessions(opts.bins, opts.padId, opts.device.compile(opts.referenceGraph), opts.device.compile(critic), upload(opts.reference), upload(opts.critic));
  }

  /** Runs the reference's graph on `inputs` (its weights added). */
  reference(inputs: Record<string, HostTensor>): Promise<Record<string, HostTensor>> {
    return this.refSession.run({ ...this.referenceWeights, ...inputs });
  }

  /** The critic's estimates of each row's realised tokens and candidates: one tree pass for all rows. */
  async estimates(rows: readonly TreeRow[]): Promise<TreeEstimates[]> {
    const out = await this.criticSession.run({ ...this.criticWeights, ...padTreeBatch(rows, this.padId) });
    return rows.map((row, b) => treeEstimates(this.bins, out.cell_probs.data as Float32Array, out.cell_probs.dims, row, b));
  }

  /** Releases both sessions and both models' weights. */
  dispose(): void {
    this.refSession.dispose();
    this.criticSession.dispose();
    for (const t of [...Object.values(this.referenceWeights), ...Object.values(this.criticWeights)]) t.dispose();
  }
}
