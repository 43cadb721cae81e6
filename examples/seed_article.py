"""The seed article's code, run as written there with `verl` read as `hybridflow`.

The article ("强化学习入门新利器：verl为何值得你一试？") shows: checking the install (2.2),
the minimal PPO in three steps (2.3), switching to GRPO (3.1), a device map (3.2) and a
remote reward model (3.3). Two things differ, so that it runs offline on a CPU in seconds:
the article's facebook/opt-125m actor and EleutherAI/pythia-160m-deduped reward model are
tiny random-weight folders made here in code (ACTOR, REWARD_MODEL; the reward model gets
a new score head, as a causal LM loaded for sequence classification does, with a
warning), and max_steps is 2 instead of 100. The device map names GPUs the way the
article does; it is only assigned (and validated), not trained with, so no GPU is needed.

    python examples/seed_article.py      # writes runs/hybridflow/ in the current folder
"""
import os
import tempfile

from hybridflow.data import create_tiny_model_dir

_models = tempfile.mkdtemp(prefix="hybridflow-seed-models-")
ACTOR = str(create_tiny_model_dir(os.path.join(_models, "opt-125m-stand-in"), seed=0))
REWARD_MODEL = str(create_tiny_model_dir(os.path.join(_models, "pythia-160m-stand-in"), seed=1))

# -- 2.2 一行代码验证安装 ----------------------------------------------------------------
import hybridflow
print(hybridflow.__version__)
print(dir(hybridflow))

# -- 2.3 第一步：定义配置 -----------------------------------------------------------------
from hybridflow import PPOConfig
config = PPOConfig(
    actor_model_name=ACTOR,  # 小模型，本地可跑
    reward_model_name=REWARD_MODEL,
    max_steps=2,
    batch_size=4,
    rollout_batch_size=8
)

# -- 2.3 第二步：初始化训练器 ---------------------------------------------------------------
from hybridflow.trainer import PPOTrainer
trainer = PPOTrainer(config=config)

# -- 2.3 第三步：启动训练（单GPU，无Ray） ------------------------------------------------------
trainer.train()

# -- 3.1 GRPO：只需替换一个类 ---------------------------------------------------------------
from hybridflow.algorithms import GRPOTrainer
# 原来是 PPOTrainer(config)，现在换成：
trainer = GRPOTrainer(config=config)
trainer.train()  # 其余代码完全不动

# -- 3.2 细粒度设备映射 ---------------------------------------------------------------------
config.device_map = {
    "actor": "cuda:0",  # Actor主干放0号卡
    "actor_lora": "cuda:1",  # LoRA适配器放1号卡
    "critic": "cuda:0",  # Critic共享0号卡显存
    "rm": "cpu"  # Reward Model放CPU，用FP16推理
}

# -- 3.3 远程 Reward Model -------------------------------------------------------------------
from hybridflow.utils import RemoteRewardModel
# 指向你已运行的vLLM API端点
rm_client = RemoteRewardModel(
    api_url="http://localhost:8000/v1/rank",
    model_name="rm-bloomz"
)
# 注入到trainer中
trainer.set_reward_model(rm_client)
