"""AlexNet as torchvision defines it (torchvision.models.alexnet, without torchvision), for
`pump trace generate --model examples/alexnet.py:alexnet`: the model and a batch of 128 images
of 224 x 224, the batch of the AlexNet profile docs/simulate.md's worked example matches.

    pump trace generate --model examples/alexnet.py:alexnet --inference --steps 2 -o alexnet.trace
"""

import torch
from torch import nn

BATCH = 128


class AlexNet(nn.Module):
    def __init__(self, num_classes: int = 1000, dropout: float = 0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
            nn.Dropout(p=dropout), nn.Linear(4096, 4096), nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def alexnet(batch: int = BATCH):
    """(model, batch): what `pump trace generate --model` calls, under torch.device("meta")."""
    return AlexNet(), torch.empty(batch, 3, 224, 224)


def alexnet_batch_64():
    """The same model at half the profile's batch (the profile must not fit it)."""
    return alexnet(64)
