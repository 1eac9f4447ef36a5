#pragma once
// Umbrella header for hsgd::nn: modules, layers and losses.
#include "framework/nn/activation.h"
#include "framework/nn/batch_norm.h"
#include "framework/nn/conv.h"
#include "framework/nn/dropout.h"
#include "framework/nn/functional.h"
#include "framework/nn/init.h"
#include "framework/nn/linear.h"
#include "framework/nn/module.h"
#include "framework/nn/pooling.h"
#include "framework/nn/sequential.h"
