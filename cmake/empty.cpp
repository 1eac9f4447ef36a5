// Keeps a folder library valid while the folder has no sources of its own yet.
namespace hsgd::detail {
[[maybe_unused]] static const int kEmptyTranslationUnit = 0;
}  // namespace hsgd::detail
