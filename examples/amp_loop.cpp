// Example: PyTorch's automatic-mixed-precision training loop, line for line, in fp16 on
// Fashion-MNIST: a small CNN, AdamW, a dynamic GradScaler, gradient clipping on the unscaled
// gradients. Prints the loss going down and the loss scale; exits 1 if the loss did not go down.
//   example_amp_loop [DATA_DIR]     (default /usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist)
//
// The PyTorch loop it mirrors (each line below carries its PyTorch twin as a comment):
//   model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), ...)
//   opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
//   scaler = torch.cuda.amp.GradScaler()
//   for x, y in loader:
//       opt.zero_grad()
//       with torch.autocast(device_type, dtype=torch.float16):
//           loss = F.cross_entropy(model(x), y)
//       scaler.scale(loss).backward()
//       scaler.unscale_(opt)
//       torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
//       scaler.step(opt)
//       scaler.update()
// (The amp-fp16 preset, amp::precision_preset("amp-fp16"), names this same recipe: autocast to
// f16, f32 parameters, a dynamic scaler with PyTorch's defaults.)
#include <cstdio>
#include <string>

#include "mixprec/mixprec.h"

using namespace mixprec;

int main(int argc, char** argv) {
  const std::string data_dir = argc > 1 ? argv[1] : data::kDefaultDataDir;
  const int64_t steps = 200, report_every = 40;
  try {
    default_generator().manual_seed(0);
    const data::Dataset train = data::load_idx_dataset(data_dir, "train");
    data::BatchLoader loader(train, {.batch_size = 64, .seed = 0, .norm = data::kFashionMnistNorm});

    // model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), ..., nn.Linear(784, 10))
    nn::Sequential model(nn::Conv2d(1, 8, 3, {.padding = 1}), nn::ReLU(), nn::MaxPool2d(2),
                         nn::Conv2d(8, 16, 3, {.padding = 1}), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                         nn::Linear(16 * 7 * 7, 10));
    optim::AdamW opt(model.parameters(), {.lr = 2e-3});  // opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    amp::GradScaler scaler;                              // scaler = torch.cuda.amp.GradScaler()

    std::printf("amp-fp16: %lld parameters, %lld steps of 64 Fashion-MNIST images\n", (long long)model.num_parameters(),
                (long long)steps);
    double window = 0, first = 0, last = 0;
    data::HostBatch b;
    loader.begin_epoch(0);
    for (int64_t step = 1; step <= steps && loader.next(b); ++step) {  // for x, y in loader:
      const data::DeviceBatch d = data::to_device(b, train.rows, train.cols, Device::cpu());
      opt.zero_grad();  // opt.zero_grad()
      Tensor loss;
      {
        amp::Autocast ac(DType::f16);                // with torch.autocast(..., dtype=torch.float16):
        loss = ops::cross_entropy(model(d.x), d.y);  //     loss = F.cross_entropy(model(x), y)
      }
      scaler.scale(loss).backward();                 // scaler.scale(loss).backward()
      scaler.unscale_(opt);                          // scaler.unscale_(opt)
      nn::clip_grad_norm_(model.parameters(), 1.0);  // torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      scaler.step(opt);                              // scaler.step(opt)
      scaler.update();                               // scaler.update()

      window += loss.item();
      if (step % report_every == 0) {
        const double mean = window / double(report_every);
        if (step == report_every) first = mean;
        last = mean;
        std::printf("step %4lld  loss %.4f (mean of the last %lld)  scale %g  skipped steps %lld\n", (long long)step,
                    mean, (long long)report_every, scaler.get_scale(), (long long)scaler.num_skipped_steps());
        window = 0;
      }
    }
    loader.stop();
    const bool down = last < first;
    std::printf("loss %.4f -> %.4f: %s\n", first, last, down ? "down" : "NOT DOWN");
    return down ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "example_amp_loop: error: %s\n", e.what());
    return 1;
  }
}
