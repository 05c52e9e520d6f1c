/** @lathe/graders: math answer verification, format rewards, sandboxed code execution and LLM judges. */
export { extractAnswer, lastBoxed, r1ZeroAnswer, gsm8kAnswer, answerIsAnswer, trailingMathSpan, ANSWER_FORMATS, type AnswerFormat } from './math/extract';
export { normalizeAnswer, type NormalizeOptions } from './math/normalize';
export { evaluateConstant, evaluateAt, takesTwoValues } from './math/evaluate';
export { parseNumber, numbersClose, type ParsedNumber, type PercentMode } from './math/numbers';
export { parseAnswer, type AnswerNode, type RelationOp } from './math/structure';
export { MATH_DEFAULTS, type MathOptions } from './math/options';
export { answersEquivalent, type Equivalence, type EquivalenceReason } from './math/equivalence';
export { CasPool, CAS_POOL_DEFAULTS, type CasPoolOptions, type CasOutcome } from './math/cas-pool';
export { MathGrader, closeTruncatedBox, type MathGraderOptions, type MathVerdict, type MathReason } from './math/grade';
export { gradeJsonl, gradeSchema, resolveGradeOptions, formatGradeSummary, type GradeJsonlOptions, type GradeSummary } from './grade-jsonl';
export { thinkFormatReward, r1ZeroFormatReward, overlongPenalty, type ThinkFormatOptions, type OverlongOptions } from './format-rewards';
export { accuracyReport, passAtK, meanPassAtK, bestOfN, majorityVote, voteKey, type AccuracyReport, type AccuracyCell, type GradedRow } from './eval/metrics';
export { loadMath500, loadGsm8k, type MathProblem } from './eval/datasets';
export { runSandboxed, sandboxAvailable, SANDBOX_DEFAULTS, type SandboxLimits, type SandboxLanguage, type RunRequest, type RunResult, type RunStatus } from './code/sandbox';
export { runCodeTests, normalizeOutput, jsonEqual, type CodeTestRequest, type CodeTestResult, type CodeCaseResult, type StdioTestCase, type CallTestCase } from './code/tests';
export { startSandboxService, SANDBOX_SERVICE_DEFAULTS, type SandboxService, type SandboxServiceOptions } from './code/service';
export { LlmJudge, parseVerdict, DEFAULT_JUDGE_PROMPT, JUDGE_DEFAULTS, type JudgeOptions, type JudgeItem, type JudgeVerdict } from './judge/judge';
