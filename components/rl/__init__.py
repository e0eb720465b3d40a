"""Reinforcement learning pieces hydratune writes itself: PPO's rollout, advantages and losses."""
