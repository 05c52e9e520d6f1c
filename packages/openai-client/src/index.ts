/** @lathe/openai-client — calls to OpenAI-compatible servers (lathe serve, vLLM, SGLang, OpenAI) with timeouts and retries. */
export * from './client';
