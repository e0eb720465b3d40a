"""hydratune recipes: one thin runner per pipeline (sft; reward, dpo, ppo, grpo build on the same parts)."""
