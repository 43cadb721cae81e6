"""The front door: typed configs and the trainers of the seed article.

``from hybridflow.trainer import PPOTrainer; PPOTrainer(config=PPOConfig(...)).train()``
"""
from .config import PPOConfig
from .trainer import GRPOTrainer, PPOTrainer, ReinforcePPTrainer, ReMaxTrainer, RLOOTrainer, Trainer

__all__ = ["PPOConfig", "Trainer", "PPOTrainer", "GRPOTrainer", "RLOOTrainer", "ReinforcePPTrainer", "ReMaxTrainer"]
