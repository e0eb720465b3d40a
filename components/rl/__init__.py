"""Reinforcement learning hydratune writes itself: PPO's pieces (rollout, advantages, losses) and its loop."""
