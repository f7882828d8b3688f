#pragma once
// Placeholder: the pg helper defines Result and pg::errc here.
namespace idem::pg { class Result; }
