"""The request layer no transport owns: the error a check raises, and the checks every
protocol shares (model lookup, task, priority, long-text options, texts, prompts)."""
