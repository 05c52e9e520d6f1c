/**
 * `lathe serve` through the official `openai` client (serve-cases.ts), with the HTTP layer on its
 * own worker thread (`--http_thread true`, the default).
 */
import { serveApiCases } from './serve-cases';

serveApiCases(true);
