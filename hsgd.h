#pragma once
// hsgd's umbrella header for APPLICATIONS (apps/, tests, programs built with find_package(hsgd)):
// the tensor and autograd core, nn layers, data, optimizers, models and the distributed API.
// It sits at the repository root, above every layer, because it includes all of them. Library
// code (comm/, framework/, optim/, models/) includes the specific headers it needs instead;
// scripts/check_layers.py, run by the test suite, refuses any include that points up a layer.
//
// Usage:
//   #include "hsgd.h"
//   hsgd::Generator gen(0);
//   hsgd::Tensor x = hsgd::randn({8, 784}, gen);
//   auto model = hsgd::models::make_model("resnet20", {.num_classes = 10, .seed = 1});
//   hsgd::optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});

// ---- comm ----
#include "comm/error.h"
#include "comm/process_group/init.h"
#include "comm/process_group/process_group.h"
#include "comm/process_group/subgroups.h"
#include "comm/store/store.h"

// ---- tensor and autograd ----
#include "framework/autograd/engine.h"
#include "framework/autograd/node.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/block_cache.h"
#include "framework/tensor/generator.h"
#include "framework/tensor/grad_mode.h"
#include "framework/tensor/index_tensor.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/tensor.h"

// ---- nn, data, training ----
#include "framework/data/cifar10.h"
#include "framework/data/data_loader.h"
#include "framework/data/dataset.h"
#include "framework/data/fashion_mnist.h"
#include "framework/data/idx.h"
#include "framework/data/synthetic_dataset.h"
#include "framework/data/text.h"
#include "framework/nn/nn.h"
#include "framework/train/optimizer.h"

// ---- checkpoints ----
#include "framework/checkpoint/checkpointer.h"

// ---- distributed ----
#include "framework/distributed/averaged_replicas.h"
#include "framework/distributed/comm_hooks/default_hooks.h"
#include "framework/distributed/comm_hooks/post_local_sgd_hook.h"
#include "framework/distributed/ddp.h"
#include "framework/distributed/grad_bucket.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/distributed/model_averaging/hierarchical_model_averager.h"
#include "framework/distributed/model_averaging/hierarchy_text.h"
#include "framework/distributed/model_averaging/utils.h"
#include "framework/distributed/tensor_collectives.h"

// ---- the training runtime: elastic, durable ----
#include "comm/process_group/worker_progress.h"
#include "framework/runtime/preemption.h"
#include "framework/runtime/runtime.h"

// ---- optim, models ----
#include "models/gpt.h"
#include "models/mlp.h"
#include "models/registry.h"
#include "models/resnet.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "optim/post_local_sgd_optimizer.h"
#include "optim/sgd.h"
