// Command goorig runs the Go original (KusionStack ResourceConsist v0.0.7, controller-runtime
// v0.10.3) with an adapter doing the same provider work as our Python `demo` adapter: an
// in-memory map of a VIP and real servers per Service, a real server per selected pod with
// traffic on and weight 100 while the pod is lifecycle-ready, off and 0 otherwise. It exists
// only so that bench/bench_pace.py --go can measure the original beside ours on the same API
// server (docs/benchmarks.md); hack/build-go-original.sh builds it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"

	frame "kusionstack.io/resourceconsist/pkg/frame/controller"
)

const (
	demoVIP          = "demo-remote-VIP"
	demoQPS          = 100
	conditionAnnoKey = "resource-consist.kusionstack.io/demo-condition"
)

// traffic is what the provider stores for a real server besides its IP.
type traffic struct {
	On     bool
	Weight int
}

type realServer struct {
	IP      string
	Traffic traffic
}

type vipStatus struct {
	VIP string
	QPS int
}

// provider is the in-memory load balancer: one VIP and one set of real servers per Service.
type provider struct {
	mu      sync.Mutex
	vips    map[string]vipStatus
	servers map[string]map[string]realServer
}

func newProvider() *provider {
	return &provider{vips: map[string]vipStatus{}, servers: map[string]map[string]realServer{}}
}

type vip struct {
	id     string
	status vipStatus
}

func (v *vip) GetEmployerId() string                   { return v.id }
func (v *vip) GetEmployerStatuses() interface{}        { return v.status }
func (v *vip) SetEmployerStatuses(s interface{})       { v.status = s.(vipStatus) }
func (v *vip) EmployerEqual(o frame.IEmployer) (bool, error) {
	other, ok := o.(*vip)
	return ok && v.id == other.id && v.status == other.status, nil
}

type server struct {
	name     string
	statuses frame.PodEmployeeStatuses
}

func (s *server) GetEmployeeId() string            { return s.name }
func (s *server) GetEmployeeName() string          { return s.name }
func (s *server) GetEmployeeStatuses() interface{} { return s.statuses }
func (s *server) SetEmployeeStatuses(v interface{}) {
	s.statuses = v.(frame.PodEmployeeStatuses)
}

// EmployeeEqual compares what the provider stores (IP and traffic), not readiness itself.
func (s *server) EmployeeEqual(o frame.IEmployee) (bool, error) {
	other, ok := o.(*server)
	if !ok {
		return false, nil
	}
	return s.name == other.name && s.statuses.Ip == other.statuses.Ip &&
		s.statuses.ExtraStatus == other.statuses.ExtraStatus, nil
}

type adapter struct {
	client.Client
	p *provider
}

var (
	_ frame.ReconcileAdapter               = &adapter{}
	_ frame.ReconcileLifecycleOptions      = &adapter{}
	_ frame.ExpectedFinalizerRecordOptions = &adapter{}
	_ frame.StatusRecordOptions            = &adapter{}
)

func key(employer client.Object) string {
	return employer.GetNamespace() + "/" + employer.GetName()
}

func (a *adapter) GetControllerName() string                   { return "demo-controller" }
func (a *adapter) FollowPodOpsLifeCycle() bool                 { return true }
func (a *adapter) NeedRecordLifecycleFinalizerCondition() bool { return false }
func (a *adapter) NeedRecordExpectedFinalizerCondition() bool  { return true }

func (a *adapter) selectedPods(ctx context.Context, employer client.Object) ([]corev1.Pod, error) {
	svc, ok := employer.(*corev1.Service)
	if !ok {
		return nil, fmt.Errorf("employer %s is not a Service", key(employer))
	}
	var pods corev1.PodList
	selector := labels.SelectorFromSet(svc.Spec.Selector)
	err := a.List(ctx, &pods, &client.ListOptions{Namespace: svc.Namespace, LabelSelector: selector})
	return pods.Items, err
}

func (a *adapter) GetSelectedEmployeeNames(ctx context.Context, employer client.Object) ([]string, error) {
	pods, err := a.selectedPods(ctx, employer)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(pods))
	for i := range pods {
		names = append(names, pods[i].Name)
	}
	return names, nil
}

// setCondition records (or, with message "", erases) the demo's error annotation, as ours does.
func (a *adapter) setCondition(ctx context.Context, employer client.Object, message string) error {
	annotations := employer.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[conditionAnnoKey] = message
	employer.SetAnnotations(annotations)
	return a.Update(ctx, employer)
}

func (a *adapter) RecordStatuses(ctx context.Context, employer client.Object,
	_ frame.CUDEmployerResults, _ frame.CUDEmployeeResults) error {
	if employer.GetAnnotations()[conditionAnnoKey] == "" {
		return nil
	}
	return a.setCondition(ctx, employer, "")
}

func (a *adapter) RecordErrorConditions(ctx context.Context, employer client.Object, err error) error {
	if employer.GetAnnotations()[conditionAnnoKey] == err.Error() {
		return nil
	}
	return a.setCondition(ctx, employer, err.Error())
}

func (a *adapter) GetExpectedEmployer(_ context.Context, employer client.Object) ([]frame.IEmployer, error) {
	if !employer.GetDeletionTimestamp().IsZero() {
		return nil, nil
	}
	return []frame.IEmployer{&vip{id: key(employer), status: vipStatus{VIP: demoVIP, QPS: demoQPS}}}, nil
}

func (a *adapter) GetCurrentEmployer(_ context.Context, employer client.Object) ([]frame.IEmployer, error) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	found, ok := a.p.vips[key(employer)]
	if !ok {
		return nil, nil
	}
	return []frame.IEmployer{&vip{id: key(employer), status: found}}, nil
}

func (a *adapter) putVIPs(items []frame.IEmployer) ([]frame.IEmployer, []frame.IEmployer, error) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	for _, item := range items {
		a.p.vips[item.GetEmployerId()] = item.GetEmployerStatuses().(vipStatus)
	}
	return items, nil, nil
}

func (a *adapter) CreateEmployer(_ context.Context, _ client.Object, items []frame.IEmployer) ([]frame.IEmployer, []frame.IEmployer, error) {
	return a.putVIPs(items)
}

func (a *adapter) UpdateEmployer(_ context.Context, _ client.Object, items []frame.IEmployer) ([]frame.IEmployer, []frame.IEmployer, error) {
	return a.putVIPs(items)
}

func (a *adapter) DeleteEmployer(_ context.Context, _ client.Object, items []frame.IEmployer) ([]frame.IEmployer, []frame.IEmployer, error) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	for _, item := range items {
		delete(a.p.vips, item.GetEmployerId())
	}
	return items, nil, nil
}

func (a *adapter) GetExpectedEmployee(ctx context.Context, employer client.Object) ([]frame.IEmployee, error) {
	if !employer.GetDeletionTimestamp().IsZero() {
		return nil, nil
	}
	pods, err := a.selectedPods(ctx, employer)
	if err != nil {
		return nil, err
	}
	expected := make([]frame.IEmployee, 0, len(pods))
	for i := range pods {
		pod := &pods[i]
		if !pod.DeletionTimestamp.IsZero() {
			continue
		}
		statuses, err := frame.GetCommonPodEmployeeStatus(pod)
		if err != nil {
			return nil, err
		}
		t := traffic{}
		if statuses.LifecycleReady {
			t = traffic{On: true, Weight: 100}
		}
		statuses.ExtraStatus = t
		expected = append(expected, &server{name: pod.Name, statuses: statuses})
	}
	return expected, nil
}

func (a *adapter) GetCurrentEmployee(_ context.Context, employer client.Object) ([]frame.IEmployee, error) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	group := a.p.servers[key(employer)]
	current := make([]frame.IEmployee, 0, len(group))
	for name, rs := range group {
		current = append(current, &server{
			name:     name,
			statuses: frame.PodEmployeeStatuses{Ip: rs.IP, ExtraStatus: rs.Traffic},
		})
	}
	return current, nil
}

func (a *adapter) putServers(employer client.Object, items []frame.IEmployee) ([]frame.IEmployee, []frame.IEmployee, error) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	group := a.p.servers[key(employer)]
	if group == nil {
		group = map[string]realServer{}
		a.p.servers[key(employer)] = group
	}
	for _, item := range items {
		statuses := item.GetEmployeeStatuses().(frame.PodEmployeeStatuses)
		group[item.GetEmployeeId()] = realServer{IP: statuses.Ip, Traffic: statuses.ExtraStatus.(traffic)}
	}
	return items, nil, nil
}

func (a *adapter) CreateEmployees(_ context.Context, employer client.Object, items []frame.IEmployee) ([]frame.IEmployee, []frame.IEmployee, error) {
	return a.putServers(employer, items)
}

func (a *adapter) UpdateEmployees(_ context.Context, employer client.Object, items []frame.IEmployee) ([]frame.IEmployee, []frame.IEmployee, error) {
	return a.putServers(employer, items)
}

func (a *adapter) DeleteEmployees(_ context.Context, employer client.Object, items []frame.IEmployee) ([]frame.IEmployee, []frame.IEmployee, error) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	group := a.p.servers[key(employer)]
	for _, item := range items {
		delete(group, item.GetEmployeeId())
	}
	if len(group) == 0 {
		delete(a.p.servers, key(employer))
	}
	return items, nil, nil
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "path of the kubeconfig (required)")
	namespace := flag.String("namespace", "", "watch only this namespace (default: all)")
	qps := flag.Float64("qps", 20, "client QPS (controller-runtime's default 20); 0 or less: unthrottled")
	burst := flag.Int("burst", 30, "client burst (controller-runtime's default 30)")
	flag.Parse()
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "goorig: --kubeconfig is required: pass the path of the API server's kubeconfig")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "goorig: cannot read kubeconfig %s: %v\n", *kubeconfig, err)
		os.Exit(2)
	}
	// client-go installs no rate limiter when QPS is negative (0 would mean its default of 5).
	cfg.QPS, cfg.Burst = float32(*qps), *burst
	if *qps <= 0 {
		cfg.QPS = -1
	}
	mgr, err := manager.New(cfg, manager.Options{
		Namespace:              *namespace,
		MetricsBindAddress:     "0",
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "goorig: cannot create the manager: %v\n", err)
		os.Exit(1)
	}
	if err := frame.AddToMgr(mgr, &adapter{Client: mgr.GetClient(), p: newProvider()}); err != nil {
		fmt.Fprintf(os.Stderr, "goorig: cannot add the controller: %v\n", err)
		os.Exit(1)
	}
	if err := mgr.Start(signals.SetupSignalHandler()); err != nil {
		fmt.Fprintf(os.Stderr, "goorig: manager stopped: %v\n", err)
		os.Exit(1)
	}
}
