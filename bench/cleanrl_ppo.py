"""A CleanRL-style single-process PPO: the baseline of issue 11's speed and learning targets.

Written after CleanRL's ``ppo_continuous_action.py`` (same defaults, same network, same
Gymnasium wrappers, same update), instrumented to split the loop's time into env
stepping, per-step inference and the update. Run::

    .venv/bin/python bench/cleanrl_ppo.py --env-id HalfCheetah-v5 --total-timesteps 1000000

It prints one JSON line per iteration (``--jsonl PATH`` also writes them) and a summary
with the time split at the end.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, fields
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.normal import Normal


@dataclass
class Args:
    """CleanRL's ``ppo_continuous_action.py`` defaults."""

    env_id: str = "HalfCheetah-v5"
    seed: int = 1
    total_timesteps: int = 1_000_000
    learning_rate: float = 3e-4
    num_envs: int = 1
    num_steps: int = 2048
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 32
    update_epochs: int = 10
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    torch_threads: int = 1
    jsonl: str = ""


def make_env(env_id: str, gamma: float) -> gym.Env[Any, Any]:
    """The env with CleanRL's wrapper stack (normalised and clipped observations and rewards)."""
    env = gym.make(env_id)
    env = gym.wrappers.FlattenObservation(env)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.ClipAction(env)
    env = gym.wrappers.NormalizeObservation(env)
    env = gym.wrappers.TransformObservation(
        env, lambda obs: np.clip(obs, -10, 10), env.observation_space
    )
    env = gym.wrappers.NormalizeReward(env, gamma=gamma)
    env = gym.wrappers.TransformReward(env, lambda reward: float(np.clip(float(reward), -10, 10)))
    return env


def layer_init(layer: nn.Linear, std: float = float(np.sqrt(2)), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights, constant bias (CleanRL's init)."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias)
    return layer


class Agent(nn.Module):
    """Separate 64x64 tanh actor and critic, Gaussian policy with state-independent log-std."""

    def __init__(self, obs_dim: int, act_dim: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, act_dim), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(
        self, x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        mean = self.actor_mean(x)
        std = torch.exp(self.actor_logstd.expand_as(mean))
        probs = Normal(mean, std)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in fields(Args):
        default = f.default
        flag = "--" + f.name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(
                flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=default
            )
        else:
            parser.add_argument(flag, type=type(default), default=default)
    return Args(**vars(parser.parse_args()))


def main() -> None:
    args = parse_args()
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    torch.set_num_threads(args.torch_threads)
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = True

    envs = gym.vector.SyncVectorEnv(
        [lambda: make_env(args.env_id, args.gamma) for _ in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )
    obs_shape = envs.single_observation_space.shape
    act_shape = envs.single_action_space.shape
    assert obs_shape is not None
    assert act_shape is not None
    agent = Agent(int(np.prod(obs_shape)), int(np.prod(act_shape)))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    obs = torch.zeros((args.num_steps, args.num_envs, *obs_shape))
    actions = torch.zeros((args.num_steps, args.num_envs, *act_shape))
    logprobs = torch.zeros((args.num_steps, args.num_envs))
    rewards = torch.zeros((args.num_steps, args.num_envs))
    dones = torch.zeros((args.num_steps, args.num_envs))
    values = torch.zeros((args.num_steps, args.num_envs))

    global_step = 0
    start = time.perf_counter()
    t_env = t_infer = t_update = 0.0
    returns: list[float] = []
    out = open(args.jsonl, "w") if args.jsonl else None  # noqa: SIM115  # open for the whole run
    next_obs_np, _ = envs.reset(seed=args.seed)
    next_obs = torch.Tensor(next_obs_np)
    next_done = torch.zeros(args.num_envs)

    for iteration in range(1, num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done
            t0 = time.perf_counter()
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob
            t1 = time.perf_counter()
            next_obs_np, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            t2 = time.perf_counter()
            t_infer += t1 - t0
            t_env += t2 - t1
            next_done_np = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(next_obs_np), torch.Tensor(next_done_np)
            if "episode" in infos:
                for k in np.flatnonzero(infos["_episode"]):
                    returns.append(float(infos["episode"]["r"][k]))

        t0 = time.perf_counter()
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = torch.zeros(args.num_envs)
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns_t = advantages + values

        b_obs = obs.reshape((-1, *obs_shape))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1, *act_shape))
        b_advantages = advantages.reshape(-1)
        b_returns = returns_t.reshape(-1)
        b_values = values.reshape(-1)

        b_inds = np.arange(batch_size)
        clipfracs = []
        for _epoch in range(args.update_epochs):
            rng.shuffle(b_inds)
            for begin in range(0, batch_size, minibatch_size):
                mb_inds = b_inds[begin : begin + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb_inds], b_actions[mb_inds]
                )
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())
                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (
                        mb_advantages.std() + 1e-8
                    )
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(
                    ratio, 1 - args.clip_coef, 1 + args.clip_coef
                )
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
        t_update += time.perf_counter() - t0

        elapsed = time.perf_counter() - start
        record = {
            "iteration": iteration,
            "global_step": global_step,
            "elapsed_s": round(elapsed, 3),
            "sps": round(global_step / elapsed, 1),
            "mean_return": float(np.mean(returns[-10:])) if returns else None,
            "approx_kl": float(approx_kl),
            "clipfrac": float(np.mean(clipfracs)),
        }
        line = json.dumps(record)
        print(line, flush=True)
        if out is not None:
            out.write(line + "\n")
            out.flush()

    total = time.perf_counter() - start
    summary = {
        "summary": True,
        "env_id": args.env_id,
        "global_step": global_step,
        "elapsed_s": round(total, 2),
        "sps": round(global_step / total, 1),
        "final_mean_return": float(np.mean(returns[-10:])) if returns else None,
        "time_split": {
            "env": round(t_env / total, 3),
            "inference": round(t_infer / total, 3),
            "update": round(t_update / total, 3),
            "other": round(1 - (t_env + t_infer + t_update) / total, 3),
        },
    }
    print(json.dumps(summary), flush=True)
    if out is not None:
        out.write(json.dumps(summary) + "\n")
        out.close()
    envs.close()


if __name__ == "__main__":
    main()
