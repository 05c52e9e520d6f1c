"""The data-parallel wiring of lathe sft, rm train and dpo (issue 35), as anchored edits: the same
change as data-parallel-recipes.patch, for when those files have moved on since the patch was made.
It makes each command join the job it was started in (joinDataParallel), split each global batch
over the ranks, all-reduce gradients through Trainer's onGradients hook, write the run directory from
rank 0 only (openRankRunDir), and stop on the same step; it lists the three commands in
DATA_PARALLEL_COMMANDS and adds their CPU test (apps/trainer/test/launch-sft.test.ts).

usage: python3 tools/bench/distributed/wire-data-parallel.py [ROOT]   (default: the repository)
An anchor that no longer matches stops it with the file and the text it looked for.
"""
import sys, os, re
root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..')
def patch(rel, reps):
    p = os.path.join(root, rel)
    s = open(p).read()
    for old, new in reps:
        if callable(old):
            s = old(s); continue
        assert s.count(old) == 1, (rel, old[:80], s.count(old))
        s = s.replace(old, new)
    open(p, 'w').write(s)

# ---- sft.ts
def sft_import(s):
    line = [l for l in s.split('\n') if l.startswith("import { checkComputeDtype,") and "'./scaffold'" in l][0]
    new = line.replace(' RunDir,', '')
    s = s.replace(line, new)
    imp = [l for l in s.split('\n') if l.startswith("import { evalPromptIds,")][0]
    return s.replace(imp, "import { anyRankStopped, joinDataParallel, openRankRunDir } from './launch-dp';\n" + imp)
patch('packages/recipes/src/sft.ts', [
    (sft_import, None),
    ("""  const run = RunDir.open(cfg);
""", """  // Under lathe launch (or torchrun's or Slurm's variables): this rank's place in a data-parallel
  // job, which takes its share of each global batch; rank 0 alone writes the run directory.
  const dp = await joinDataParallel({ device: cfg.device, config: cfg, batch: { rows: cfg.batch_size, microBatches: cfg.micro_batches } });
  if (dp && staticShape) throw new Error('--cuda_graph runs the train step as one captured run, which leaves no place for the gradient all-reduce of a data-parallel job (lathe launch): drop --cuda_graph');
  const run = await openRankRunDir(cfg, dp);
"""),
    ("""  const { train, evaluation } = await loadExamples(cfg);
""", """  const { train, evaluation: heldOut } = await loadExamples(cfg);
  // evaluations run on rank 0 only (the other ranks wait for it at their next all-reduce)
  const evaluation = dp && !dp.main ? [] : heldOut;
"""),
    ("""  const benchmarks = await TrainBenchmarks.load(cfg);""", """  const benchmarks = dp && !dp.main ? undefined : await TrainBenchmarks.load(cfg);"""),
    ("""  const device = Device.open(cfg.device);""", """  const device = Device.open(cfg.device, dp ? { id: dp.deviceId } : {});"""),
    ("""frozen: frozenBase, ...(cudaGraph ? { cudaGraph: true } : staticShape ? { staticInputs: true } : {}) },""",
     """frozen: frozenBase, ...(cudaGraph ? { cudaGraph: true } : staticShape ? { staticInputs: true } : {}), ...(dp ? { onGradients: dp.onGradients } : {}) },"""),
    ("""      const per = cfg.batch_size / cfg.micro_batches;""", """      // every rank reads the same global batch (so the loss-token count above is global) and trains on its share
      const mine = dp ? dp.shard(batch) : batch;
      const per = mine.length / cfg.micro_batches;"""),
    ("""        const rows = batch.slice(k * per, (k + 1) * per);""", """        const rows = mine.slice(k * per, (k + 1) * per);"""),
    ("""loraDropoutKey(cfg.seed, trainer.step, k)""", """loraDropoutKey(cfg.seed, trainer.step, (dp?.world.rank ?? 0) * cfg.micro_batches + k)"""),
    ("""      const result = trainer.trainStep(micro, lr);""", """      const result = await trainer.trainStepAsync(micro, lr);"""),
    ("""packingMetrics(batch as PackedRow[], widths, per, tokens)""", """packingMetrics(mine as PackedRow[], widths, per, mine.reduce((s, e) => s + e.ids.length, 0))"""),
    ("""    const checkpoint = () => {
""", """    const checkpoint = () => {
      if (dp && !dp.main) return run.dir; // rank 0 saves the (identical) state of every rank
"""),
    ("""      if (await stopRequested(signal)) {""", """      if (await anyRankStopped(dp, await stopRequested(signal))) {"""),
    (lambda s: re.sub(r"""(    return \{ steps: state\.step, finalLoss: lastLoss, evals, checkpoint: last, interrupted[^\n]*\n)  \} finally \{\n((?:    [^\n]*\n)*?)    await run\.close\(\);\n  \}""",
        lambda m: m.group(1) + """  } catch (e) {
    // the other ranks would wait for this one at their next all-reduce: they stop now, told why
    dp?.abort((e as Error).message);
    throw e;
  } finally {
""" + m.group(2) + """    await run.close();
    await dp?.close();
  }""", s, count=1), None),
])

# ---- preference-batches.ts
patch('packages/recipes/src/preference-batches.ts', [
    ("""  o: { microBatches: number; padId: number; inputs: readonly string[]; seed: number; optimizerStep: number; extra?: (k: number, pairs: readonly PreferencePair[]) => Record<string, BatchTensor> },
): Record<string, BatchTensor>[] {""", """  o: {
    microBatches: number;
    padId: number;
    inputs: readonly string[];
    seed: number;
    optimizerStep: number;
    extra?: (k: number, pairs: readonly PreferencePair[]) => Record<string, BatchTensor>;
    /** Pairs in the whole optimizer batch, which the loss is normalised by (default `pairs.length`; a data-parallel rank's share is smaller). */
    pairCount?: number;
    /** Index of the first micro-batch in the whole optimizer batch (a data-parallel rank's), for LoRA dropout's keys. */
    microOffset?: number;
  },
): Record<string, BatchTensor>[] {"""),
    ("""loraDropoutKey(o.seed, o.optimizerStep, k)""", """loraDropoutKey(o.seed, o.optimizerStep, (o.microOffset ?? 0) + k)"""),
    ("""pairBatch(part, { padId: o.padId, pairCount: pairs.length })""", """pairBatch(part, { padId: o.padId, pairCount: o.pairCount ?? pairs.length })"""),
])

# ---- pair-run.ts
def pair_import(s):
    line = [l for l in s.split('\n') if l.startswith("import { checkComputeDtype,") and "'./scaffold'" in l][0]
    s = s.replace(line, "import { anyRankStopped, type DataParallelRun } from './launch-dp';\n" + line)
    return s.replace("import { sizeOf, type Device, type DeviceTensor } from '@lathe/runtime';", "import { Device, sizeOf, type DeviceTensor } from '@lathe/runtime';")
patch('packages/recipes/src/pair-run.ts', [
    (pair_import, None),
    ("""  /** Frees the Trainer and the frozen tensors. */
  dispose(): void;
}""", """  /** This rank's place in a data-parallel job (lathe launch), if it runs in one. */
  dp?: DataParallelRun;
  /** Frees the Trainer and the frozen tensors. */
  dispose(): void;
}"""),
    ("""  model: { config: DecoderConfig; master: ReadonlyMap<string, Float32Array>; tokenizer: { padId: number; from?: string }; loss: (o: PairLossOptions) => LossBuilder },
): PairTraining {""", """  model: { config: DecoderConfig; master: ReadonlyMap<string, Float32Array>; tokenizer: { padId: number; from?: string }; loss: (o: PairLossOptions) => LossBuilder },
  dp?: DataParallelRun,
): PairTraining {"""),
    ("""  const device = openDevice(cfg.device);""", """  // a data-parallel rank opens its own GPU (LOCAL_RANK); the kernels' device is GPU 0's
  const device = dp ? Device.open(cfg.device, { id: dp.deviceId }) : openDevice(cfg.device);"""),
    ("""{ device, microBatches: cfg.micro_batches, frozen });""", """{ device, microBatches: cfg.micro_batches, frozen, ...(dp ? { onGradients: dp.onGradients } : {}) });"""),
    ("""    lora: Boolean(lora),
    state,
    dispose() {""", """    lora: Boolean(lora),
    state,
    ...(dp ? { dp } : {}),
    dispose() {"""),
    ("""  const { cfg, run, trainer, tw, data } = o.training;
  const { held } = data;""", """  const { cfg, run, trainer, tw, data, dp } = o.training;
  // held-out evaluations and checkpoints on rank 0 only (the other ranks wait for it at their next all-reduce)
  const main = !dp || dp.main;
  const held = main ? data.held : { pairs: [] };"""),
    ("""  const checkpoint = () => {
    const snap = trainer.snapshot();""", """  const checkpoint = () => {
    if (!main) return run.dir;
    const snap = trainer.snapshot();"""),
    ("""    const feeds = pairStepFeeds(pairs, { microBatches: cfg.micro_batches, padId: o.training.tokenizer.padId, inputs: trainer.batchInputs, seed: cfg.seed, optimizerStep: trainer.step, ...(o.extraFeeds ? { extra: o.extraFeeds } : {}) });
    const hostMs0 = performance.now() - t0;
    const result = trainer.trainStep(feeds, lr);""", """    // every rank reads the same global batch and trains on its share; the loss is normalised by the whole batch's pairs
    const mine = dp ? dp.shard(pairs) : pairs;
    const feeds = pairStepFeeds(mine, {
      microBatches: cfg.micro_batches,
      padId: o.training.tokenizer.padId,
      inputs: trainer.batchInputs,
      seed: cfg.seed,
      optimizerStep: trainer.step,
      pairCount: pairs.length,
      microOffset: (dp?.world.rank ?? 0) * cfg.micro_batches,
      ...(o.extraFeeds ? { extra: o.extraFeeds } : {}),
    });
    const hostMs0 = performance.now() - t0;
    const result = await trainer.trainStepAsync(feeds, lr);"""),
    ("""    if (await stopRequested(o.signal)) {""", """    if (await anyRankStopped(dp, await stopRequested(o.signal))) {"""),
])

# ---- rm.ts, dpo.ts
for rel in ['packages/recipes/src/rm.ts', 'packages/recipes/src/dpo.ts']:
    def add_import(s):
        imp = [l for l in s.split('\n') if l.startswith("import { checkPairOptions")][0]
        s = s.replace(imp, imp + "\nimport { joinDataParallel, openRankRunDir } from './launch-dp';")
        line = [l for l in s.split('\n') if "'./scaffold'" in l and l.startswith('import')][0]
        return s
    def close_dp(s):
        return re.sub(r"""(  \} finally \{\n(?:    [^\n]*\n)*?    await run\.close\(\);\n)  \}""", lambda m: """  } catch (e) {
    // the other ranks would wait for this one at their next all-reduce: they stop now, told why
    dp?.abort((e as Error).message);
    throw e;
""" + m.group(1) + """    await dp?.close();
  }""", s, count=1)
    patch(rel, [
        (add_import, None),
        ("""  const run = RunDir.open(cfg);""", """  // under lathe launch: this rank's share of a data-parallel job; rank 0 alone writes the run directory
  const dp = await joinDataParallel({ device: cfg.device, config: cfg, batch: { rows: cfg.batch_size, microBatches: cfg.micro_batches } });
  const run = await openRankRunDir(cfg, dp);"""),
        (close_dp, None),
    ])
patch('packages/recipes/src/rm.ts', [("""    loss: (o) => bradleyTerryLoss(rm.config, { ...o, margin: cfg.margin, centerCoefficient: cfg.center_rewards_coefficient }),
  });""", """    loss: (o) => bradleyTerryLoss(rm.config, { ...o, margin: cfg.margin, centerCoefficient: cfg.center_rewards_coefficient }),
  }, dp);""")])
patch('packages/recipes/src/dpo.ts', [("""loss: (o) => dpoLoss(config, { ...dpo, ...o }) });""", """loss: (o) => dpoLoss(config, { ...dpo, ...o }) }, dp);""")])
patch('apps/trainer/src/commands/launch.ts', [("new Set<string>([])", "new Set<string>(['sft', 'rm train', 'dpo'])")])
# RunDir is no longer opened directly in these files: drop it from the import, or keep it as a type
for rel in ['packages/recipes/src/sft.ts', 'packages/recipes/src/rm.ts', 'packages/recipes/src/dpo.ts']:
    p = os.path.join(root, rel)
    s = open(p).read()
    line = [l for l in s.split('\n') if l.startswith('import') and "'./scaffold'" in l][0]
    if not re.search(r'\bRunDir\b', line):
        continue
    uses = len(re.findall(r'\bRunDir\b', s)) - 1
    values = len(re.findall(r'\bRunDir\.', s))
    new = re.sub(r' RunDir,', '', line) if uses == 0 else (re.sub(r' RunDir,', ' type RunDir,', line) if values == 0 else line)
    open(p, 'w').write(s.replace(line, new))
import shutil
shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'launch-sft.test.ts.in'), os.path.join(root, 'apps/trainer/test/launch-sft.test.ts'))
print('applied: sft, rm train and dpo join data-parallel jobs; run npx jest apps/trainer/test/launch-sft.test.ts')
