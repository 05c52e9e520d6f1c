/**
 * @lathe/data — Arrow tables, Parquet and JSONL in and out, dataset loaders, the trajectory schema,
 * the SQLite rollout store and run directories. CPU only; no dependency on the GPU layers.
 */
export const PACKAGE_NAME = '@lathe/data';

export {
  arrowType,
  batchOf,
  checkSchema,
  flattenLists,
  flattenNested,
  listData,
  nestedListData,
  scalarData,
  typeMatches,
  type ColumnKind,
  type ColumnSpec,
  type FlatList,
} from './arrow';
export {
  checkParquetFraming,
  parquetInfo,
  readParquet,
  readParquetBatches,
  readParquetSchema,
  writeParquet,
  type ParquetCompression,
  type ParquetReadOptions,
  type ParquetWriteOptions,
} from './parquet';
export { readJsonl, readJsonlAll, writeJsonl, type JsonlRecord } from './jsonl';
export {
  REWARD_PREFIX,
  TRAJECTORY_COLUMNS,
  readTrajectories,
  readTrajectoryBatches,
  rewardSources,
  tableToTrajectories,
  trajectoriesToBatch,
  validateTrajectories,
  validateTrajectoryTable,
  writeTrajectories,
  type Trajectory,
  type TrajectoryBatchOptions,
} from './trajectory';
export {
  lastBoxed,
  loadGsm8k,
  loadMath,
  loadPreferencePairs,
  loadPrompts,
  loadSftPairs,
  mathToSft,
  readRecords,
  splitPreference,
  type Gsm8kExample,
  type LoadReport,
  type MathExample,
  type PreferencePair,
  type PromptExample,
  type SftPair,
  type SourceRecord,
} from './loaders';
export { filterByTokenLength, seededRandom, seededShuffle, trainTestSplit, type Encode, type LengthFilterReport, type SplitOptions } from './sampling';
export {
  ROLLOUT_SCHEMA_VERSION,
  RolloutStore,
  deleteRolloutsAfter,
  inspectRolloutStore,
  readEvalRollouts,
  readTrainRollouts,
  type EvalRollout,
  type RolloutStoreOptions,
  type StoredEvalRollout,
  type StoredTrainRollout,
  type TrainRollout,
} from './rollout-store';
export {
  MetricsLog,
  createRunDir,
  diffConfigs,
  isRunDir,
  listEvals,
  listRunCheckpoints,
  listRuns,
  metricByStep,
  pruneCheckpoints,
  readMetrics,
  readRunConfig,
  resolveRun,
  rewindRunDir,
  runPaths,
  startRunDir,
  summarizeRun,
  type CheckpointEntry,
  type ConfigDifference,
  type EvalSummary,
  type MetricsLine,
  type PruneOptions,
  type PruneResult,
  type RewindResult,
  type RunSummary,
} from './run-dir';
export { runsDiffSchema, runsListSchema, runsPruneSchema, runsShowSchema } from './runs-options';
export { defaults, resolveConfig, type ConfigOf, type OptionSchema, type OptionSpec } from './options';
export { writeAtomic } from './atomic';
