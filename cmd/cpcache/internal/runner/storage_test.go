package runner

import (
	"context"

	"github.com/cpcache/cpcache/storage"
)

// openStorage opens the run's L3 storage (nil without Config.Storage) in its namespace with
// the options a rank of the run opens it with, for tests that read or fill it around a run.
func (p *Plan) openStorage(ctx context.Context) (storage.Storage, storage.Namespace, error) {
	st, ns, err := p.openStorageRaw(ctx, p.storageWarning)
	if err != nil {
		return nil, ns, p.storageError(err)
	}
	return st, ns, nil
}
