"""pytorch/examples' ``mnist/main.py``, as an elastic task with its own loop.

The script is the upstream one (argparse, a model, DataLoaders, Adadelta, StepLR, train and
test each epoch, save), on scikit-learn's 8×8 digits instead of MNIST (no download here),
with the lines marked ``# elastic`` changed or added (docs/training.md shows both side by
side). It runs by itself (``python -m parsl_bf.training.examples_loop --epochs 2``), under
``mpiexec -n N python -m parsl_bf.training.worker --task
parsl_bf.training.examples_loop:main --work W``, or as an ``elastic_app``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

from parsl_bf.training import elastic  # elastic
from parsl_bf.training.examples import _digits


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1, padding=1)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and args.verbose:
            print(f"Train Epoch: {epoch} [{batch_idx}/{len(train_loader)}] Loss: {loss.item():.6f}")


def test(model, device, test_loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    test_loss /= len(test_loader.dataset)
    return test_loss, correct / len(test_loader.dataset)


def main(argv=None, **options):
    parser = argparse.ArgumentParser(description="PyTorch digits example")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--save-model", default=None, help="path of the final model")
    parser.add_argument("--verbose", action="store_true")
    # As an elastic task, options come as keywords: the same names, with underscores.
    args = parser.parse_args(argv or [f"--{k.replace('_', '-')}={v}" for k, v in options.items()])

    torch.manual_seed(args.seed)
    device = elastic.device()  # elastic
    (x_train, y_train), (x_test, y_test) = _digits(args.seed)
    dataset1, dataset2 = TensorDataset(x_train, y_train), TensorDataset(x_test, y_test)
    train_loader = elastic.loader(dataset1, batch_size=args.batch_size, seed=args.seed)  # elastic
    test_loader = DataLoader(dataset2, batch_size=args.test_batch_size)

    model = Net().to(device)
    optimizer = elastic.optimizer(optim.Adadelta(model.parameters(), lr=args.lr))  # elastic
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    state = elastic.State(model=model, optimizer=optimizer, scheduler=scheduler, epoch=1)  # elastic
    accuracy = None  # elastic: a resumed run may have no epoch left
    for epoch in range(state.epoch, args.epochs + 1):  # elastic
        train(args, model, device, train_loader, optimizer, epoch)
        test_loss, accuracy = test(model, device, test_loader)
        elastic.report(test_loss=test_loss, accuracy=accuracy)  # elastic
        scheduler.step()
        state.epoch = epoch + 1  # elastic
        state.commit()  # elastic

    if args.save_model:
        elastic.save(model.state_dict(), args.save_model)  # elastic
    return {"accuracy": accuracy}


if __name__ == "__main__":
    import sys

    print(main(sys.argv[1:]))
