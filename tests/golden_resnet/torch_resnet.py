"""The PyTorch twin of hsgd's models/resnet.h, used to generate golden values and by the
throughput benchmark (apps/bench/resnet_step_bench_torch.py).

Architecture (same names as torchvision, so state dicts load unchanged on both sides):
    conv1 3x3 stride 1 (no bias) -> bn1 -> relu
    layer1 .. layerS: blocks[s] BasicBlocks with widths[s] channels; the first block of every
        stage after the first has stride 2
    adaptive average pool to 1x1 -> flatten -> fc
BasicBlock: conv1 3x3 (stride) -> bn1 -> relu -> conv2 3x3 -> bn2, plus the shortcut, -> relu.
The shortcut is the identity when shape is kept, otherwise "option B": downsample =
Sequential(conv 1x1 stride s without bias, BatchNorm2d).
CIFAR ResNet-(6n+2): blocks (n, n, n), widths (16, 32, 64).
ResNet-18 (CIFAR variant, no max-pool): blocks (2, 2, 2, 2), widths (64, 128, 256, 512).
"""
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class ResNet(nn.Module):
    def __init__(self, blocks, widths, in_channels=3, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        in_planes = widths[0]
        for s, (n, width) in enumerate(zip(blocks, widths)):
            layers = []
            for b in range(n):
                stride = 2 if (s > 0 and b == 0) else 1
                layers.append(BasicBlock(in_planes, width, stride))
                in_planes = width
            setattr(self, "layer%d" % (s + 1), nn.Sequential(*layers))
        self.num_stages = len(blocks)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        for s in range(self.num_stages):
            out = getattr(self, "layer%d" % (s + 1))(out)
        out = F.adaptive_avg_pool2d(out, (1, 1)).flatten(1)
        return self.fc(out)


def resnet_cifar(depth, num_classes=10):
    assert (depth - 2) % 6 == 0, depth
    n = (depth - 2) // 6
    return ResNet((n, n, n), (16, 32, 64), num_classes=num_classes)


def resnet18(num_classes=10):
    return ResNet((2, 2, 2, 2), (64, 128, 256, 512), num_classes=num_classes)


MODELS = {
    "resnet20": lambda: resnet_cifar(20),
    "resnet32": lambda: resnet_cifar(32),
    "resnet56": lambda: resnet_cifar(56),
    "resnet18": resnet18,
}
