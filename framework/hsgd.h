#pragma once
// hsgd's umbrella header: everything an application needs to build and train a model.
//
//   #include "framework/hsgd.h"
//   hsgd::Generator gen(0);
//   hsgd::Tensor x = hsgd::randn({8, 784}, gen);

#include "comm/error.h"
#include "framework/autograd/engine.h"
#include "framework/autograd/node.h"
#include "framework/tensor/generator.h"
#include "framework/tensor/grad_mode.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/tensor.h"
