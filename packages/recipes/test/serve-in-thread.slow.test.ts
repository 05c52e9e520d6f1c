/**
 * `lathe serve` through the official `openai` client (serve-cases.ts), with the HTTP layer on the
 * decode loop's thread (`--http_thread false`, the library's createOpenAiServer).
 */
import { serveApiCases } from './serve-cases';

serveApiCases(false);
